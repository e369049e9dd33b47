"""Named Transformer/Diff pairs, found through data: the registry ``calib/models/pairs.json``.

Each entry names a pair's two checkpoint folders (relative to the registry's folder, or absolute) and the
sha256 of each ``model.safetensors``, so ``diffquant demo --pair NAME`` runs the models that were registered, not
whatever lies at a path, and an installed package finds them through ``$DIFFQUANT_CALIB`` like the rest of the
data rather than through the source tree's layout.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from .data import calib_dir
from .errors import UserError
from .io import read_json_file

PAIRS_FILE = "models/pairs.json"  # under calib/
ARCHS = ("transformer", "diff")
WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class Pair:
    name: str
    description: str
    tokens: int | None
    paths: dict[str, Path]  # arch -> checkpoint folder
    sha256: dict[str, str]  # arch -> sha256 of its model.safetensors
    restore: str = ""  # the command that brings parked checkpoints back into a clone, said when they are missing


def registry_path() -> Path:
    return calib_dir() / PAIRS_FILE


def registered_pairs() -> tuple[dict[str, Pair], str]:
    """(name -> Pair, the default pair's name) from the registry."""
    path = registry_path()
    try:
        data = read_json_file(path)
    except (OSError, ValueError) as exc:
        raise UserError(f"the pair registry {path} cannot be read ({exc})") from None
    pairs = {name: _pair(path, name, entry) for name, entry in data.get("pairs", {}).items()}
    return pairs, data.get("default", next(iter(pairs), ""))


def _pair(registry: Path, name: str, entry: dict) -> Pair:
    try:
        paths = {arch: (registry.parent / entry[arch]["path"]).resolve() for arch in ARCHS}
        sha = {arch: str(entry[arch]["sha256"]) for arch in ARCHS}
    except (KeyError, TypeError):
        raise UserError(f"{registry}: pair {name!r} needs transformer and diff entries with path and sha256") from None
    return Pair(name, str(entry.get("description", "")), entry.get("tokens"), paths, sha, str(entry.get("restore", "")))


def pair_problem(pair: Pair) -> str | None:
    """Why the pair cannot be used as registered (a folder missing, weights changed); None when it can."""
    for arch in ARCHS:
        weights = pair.paths[arch] / WEIGHTS
        if not weights.is_file():
            hint = f" (restore it: {pair.restore})" if pair.restore else ""
            return f"{arch} model {pair.paths[arch]} is missing{hint}"
        if hashlib.sha256(weights.read_bytes()).hexdigest() != pair.sha256[arch]:
            return f"{weights} is not the registered file (sha256 differs)"
    return None


def resolve_pair(name: str | None = None) -> Pair:
    """The registered pair ``name`` (default: the registry's default), checked against its sha256."""
    pairs, default = registered_pairs()
    name = name or default
    if name not in pairs:
        raise UserError(f"no pair named {name!r} in {registry_path()}; registered: {', '.join(pairs) or 'none'}")
    pair = pairs[name]
    if (problem := pair_problem(pair)) is not None:
        raise UserError(f"pair {name!r}: {problem}")
    return pair


def pair_checkpoints(name: str, *, relative_to: Path | None = None) -> list[str]:
    """The registered pair's [transformer, diff] folders, checked as :func:`resolve_pair` does; relative to
    ``relative_to`` when given, so records that name them read the same in any clone."""
    pair = resolve_pair(name)
    paths = [pair.paths[arch] for arch in ARCHS]
    return [str(p.relative_to(relative_to.resolve()) if relative_to else p) for p in paths]
