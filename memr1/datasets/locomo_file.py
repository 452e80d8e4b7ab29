"""The LoCoMo file on disk: where it is by default, checked (and fetched when allowed) once, parsed and
cut into the paper's conversation splits. `memr1.data_modules.locomo.LoCoMoDataModule` and the evaluation
both read LoCoMo through here."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from memr1.datasets.download import ChecksumMismatchError, ensure_file
from memr1.datasets.locomo import LOCOMO_SHA256, LOCOMO_URL, parse_locomo, split_conversations
from memr1.types import Conversation

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def default_locomo_path(project_root: Path = PROJECT_ROOT) -> Path:
    """`../shared/data/locomo10.json` beside the project when that file exists, else `data/locomo10.json`
    inside it (where a download puts it)."""
    shared = (project_root / ".." / "shared" / "data" / "locomo10.json").resolve()
    return shared if shared.is_file() else project_root / "data" / "locomo10.json"


def ensure_locomo(path: Path, url: str = LOCOMO_URL, sha256: str | None = LOCOMO_SHA256, download: bool = False) -> None:
    """Check the file (its sha256 unless `sha256` is None), downloading it first when it is absent and
    `download` allows; `FileNotFoundError` naming `data.path` otherwise."""
    if not path.is_file():
        if not download:
            raise FileNotFoundError(
                f"data.path={path}: no such file. Point data.path at your copy of locomo10.json, or "
                "add data.download=true to download it to that path."
            )
        ensure_file(path, url, sha256 or LOCOMO_SHA256)
        return
    if sha256 is None:  # a copy of one's own, used as it is
        return
    try:
        ensure_file(path, url, sha256)
    except ChecksumMismatchError as error:
        raise ChecksumMismatchError(
            error.path, error.expected, error.actual,
            hint="For a copy of your own, set data.sha256=null to use it as it is; for the official file, "
            f"delete it to download it again from {url}.",
        ) from None


def locomo_splits(
    path: str | Path | None, *, sha256: str | None, download: bool | None, splits: Mapping[str, Sequence[str] | None],
    exclude_categories: Collection[int], url: str = LOCOMO_URL,
) -> dict[str, list[Conversation]]:
    """Every split's conversations, from a `data=locomo` config's values (`LoCoMoDataModule` holds the
    same ones). A missing file is downloaded only to the default location (`path` None), or when
    `download` asks: a mistyped path must say the file is missing, not try the network."""
    file = Path(path) if path is not None else default_locomo_path()
    ensure_locomo(file, url, sha256, download=(path is None) if download is None else download)
    parsed = parse_locomo(file, tuple(exclude_categories))
    return split_conversations(parsed.conversations, {name: None if ids is None else tuple(ids) for name, ids in splits.items()})


def load_locomo_split(path: str | Path | None, split: str, **options) -> list[Conversation]:
    """The conversations of one split (`locomo_splits` options)."""
    by_split = locomo_splits(path, **options)
    if split not in by_split:
        raise ValueError(f"split={split}: unknown LoCoMo split; have {sorted(by_split)}")
    return by_split[split]
