"""The outlier-regime study on top of the library: verdicts on matched Transformer/Diff pairs.

A *pair* is a dict naming checkpoints trained with identical data order::

    {"pair": "xs-s0-6.03M", "preset": "xs", "seed": 0, "budget": "6.03M", "tokens": 6029312, "cooled": True,
     "checkpoints": {"transformer": ".../final", "diff": ".../final", ...}}

with a ``transformer`` arm and one or more others (diff, gated, clipped), each set against the Transformer.
The **gate** (:mod:`.gate`): no Table-5 or Figure-8 verdict counts unless the Transformer is in the outlier
regime. Everything here is computed from records; tables and plots are made from them.

One job per module: :mod:`.pair` (arms, budget labels), :mod:`.cells` (table cells), :mod:`.table5` (profiling a
pair, where the top values sit), :mod:`.figure8` (sweeping a pair's attention logits), :mod:`.gate`,
:mod:`.memorisation`, :mod:`.verdict` (one pair's verdict), :mod:`.seeds` (statistics over seeds),
:mod:`.trend` (verdicts against training tokens), :mod:`.zeroshot` (chance tests), :mod:`.emergence_table`
(tracked outliers in blocks), :mod:`.outputs` (the verdict files) and :mod:`.demo` (``diffquant demo``'s job on
one pair). The library never imports this package (tests/test_layering.py); the CLI's ``demo`` and the scripts
under experiments/ do.
"""
