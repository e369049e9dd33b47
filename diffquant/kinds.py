"""The names measuring, quantizing and records share (pure: no torch): probe kinds and activation granularities.

Profile sites, quantizer targets, sweep targets and record fields all say a place by its kind. A kind's probes
are named after the module attribute that holds them (``layers.0.attn.logits`` has kind ``attn_logits``).
"""

# kind = value                  probe name in our models       shape (s = 2 sub-heads for Diff, else 1)
ATTN_Q = "attn_q"              # layers.{i}.attn.q             (B, H·s, T, d) rotated queries
ATTN_K = "attn_k"              # layers.{i}.attn.k             (B, K·s, S, d) rotated keys
ATTN_LOGITS = "attn_logits"    # layers.{i}.attn.logits        (B, H, T, S), Diff (B, H, 2, T, S); before the mask
ATTN_PROBS = "attn_probs"      # layers.{i}.attn.probs         as the logits: their softmax
ATTN_DIFF = "attn_diff"        # layers.{i}.attn.diff          (B, H, T, S): Diff's λ-combined map
ATTN_CLIPPED = "attn_clipped"  # layers.{i}.attn.clipped_probs (B, H, T, S): the clipped arm's probabilities
ATTN_GATE = "attn_gate"        # layers.{i}.attn.gate          (B, H, T, d): the gated arm's sigmoid gate
MLP_ACT = "mlp_act"            # layers.{i}.mlp.act            (B, T, ffn): the down projection's input
HIDDEN = "hidden"              # layers.{i}.out                (B, T, D): the residual stream after both adds
# Attention maps (query x key, causally masked): logits, softmax probabilities, Diff's λ-combined map, and the
# clipped arm's probabilities after the clip.
CAUSAL_KINDS = (ATTN_LOGITS, ATTN_PROBS, ATTN_DIFF, ATTN_CLIPPED)
# Every probe inside attention: the maps, rotated queries and keys, and the gated arm's sigmoid gate.
ATTENTION_KINDS = (ATTN_Q, ATTN_K, *CAUSAL_KINDS, ATTN_GATE)
# One vector per token (channel statistics, per-token quantization).
TOKEN_KINDS = (MLP_ACT, HIDDEN)
KINDS = (*ATTENTION_KINDS, *TOKEN_KINDS)
# Kinds whose Diff tensors carry the map index (dim 2 of a 5-d tensor): one map per sub-head pair.
MAP_KINDS = (ATTN_LOGITS, ATTN_PROBS)

# Activation granularities (dynamic quantizers at probes and Linear inputs): what one scale covers. Every scale is
# at least per sequence (batch element), so results never depend on the batch size.
SEQUENCE = "sequence"  # one scale per sequence per probe call
HEAD_GRANULARITIES = ("head", "head_map")  # per sequence and head (and Diff map): attention probes only
PER_SEQUENCE_GRANULARITIES = (SEQUENCE, *HEAD_GRANULARITIES)  # a scale over whole sequences: no query chunks
ACT_GRANULARITIES = (*PER_SEQUENCE_GRANULARITIES, "row", "token")  # row = token: one scale per vector
LEGACY_SEQUENCE = "tensor"  # SEQUENCE's name before the rename: still read from files, flags and arguments


def upgrade_legacy_granularities(data):
    """``data`` (JSON read from a file written before "tensor" was renamed "sequence": a record, quant.json, a
    QuantConfig file) with every ``"granularity": "tensor"`` spelled ``"sequence"``; a new object, ``data`` is
    untouched (arguments and flags read the old name with ``canonical_granularity``). Every
    "granularity" in these files is an activation's (weights say ``group_size``); lists are not entered."""
    if not isinstance(data, dict):
        return data
    return {key: canonical_granularity(value) if key == "granularity" and isinstance(value, str)
            else upgrade_legacy_granularities(value) for key, value in data.items()}


def canonical_granularity(name: object) -> object:
    """An activation granularity given as input, its old name ``"tensor"`` read as ``"sequence"`` (the alias
    DESIGN.md's contract keeps: one scale per sequence); any other value as it is, for the caller to check."""
    return SEQUENCE if name == LEGACY_SEQUENCE else name
