"""LoCoMo as a LightningDataModule: the file fetched once, parsed once, split by conversation.

The loaders yield batches of `memr1.types.Question` (a list per batch); the conversations behind each
split are there for the memory pipeline (`conversations(split)`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader

from memr1.datasets.locomo import (
    ADVERSARIAL_CATEGORY,
    LOCOMO_SHA256,
    LOCOMO_URL,
    SPLITS,
    LoCoMoParse,
    parse_locomo,
    split_conversations,
)
from memr1.datasets.locomo_file import default_locomo_path, ensure_locomo
from memr1.types import Conversation, Question

class LoCoMoDataModule(LightningDataModule):
    """LoCoMo questions per split, and the conversations they are about.

    `splits` maps a split name to its sample_ids (`None`: every conversation no other split names);
    the default is the paper's conv-26 / conv-30 / the other eight.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        url: str = LOCOMO_URL,
        sha256: str | None = LOCOMO_SHA256,
        download: bool | None = None,
        splits: Mapping[str, Sequence[str] | None] = SPLITS,
        exclude_categories: Collection[int] = (ADVERSARIAL_CATEGORY,),
        batch_size: int = 8,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.path = Path(path) if path is not None else default_locomo_path()
        self.url = url
        self.sha256 = sha256
        # A missing file is downloaded only to the default location, or when asked: a mistyped path
        # must say the file is missing, not try the network.
        self.download = (path is None) if download is None else download
        # Hydra configs hand over DictConfig / ListConfig: keep plain tuples.
        self.splits = {name: None if ids is None else tuple(ids) for name, ids in splits.items()}
        self.exclude_categories = tuple(exclude_categories)
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.parsed: LoCoMoParse | None = None
        self._by_split: dict[str, list[Conversation]] = {}

    def prepare_data(self) -> None:
        """Check the file (its sha256 unless `sha256` is None), downloading it first when it is absent
        and downloading is allowed; `FileNotFoundError` naming `data.path` otherwise."""
        ensure_locomo(self.path, self.url, self.sha256, self.download)

    def setup(self, stage: str | None = None) -> None:
        # Every stage needs the same small parse (~0.2 s): do it once, whatever the stage.
        if self.parsed is None:
            self.parsed = parse_locomo(self.path, self.exclude_categories)
            self._by_split = split_conversations(self.parsed.conversations, self.splits)

    def conversations(self, split: str) -> list[Conversation]:
        if self.parsed is None:
            raise RuntimeError("LoCoMoDataModule: call setup() before asking for a split")
        if split not in self._by_split:
            raise ValueError(f"LoCoMoDataModule: unknown split {split!r}; have {sorted(self._by_split)}")
        return self._by_split[split]

    def questions(self, split: str) -> list[Question]:
        return [question for conversation in self.conversations(split) for question in conversation.questions]

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        # Questions are dataclasses that default_collate cannot stack: a batch is a plain list of them.
        return DataLoader(
            self.questions(split),
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            collate_fn=list,
        )
