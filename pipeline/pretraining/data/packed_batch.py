"""A collated batch as one block of bytes, for the trip from a loader worker process to the training process.

torch sends every tensor a worker yields through a shared-memory segment of its own (numpy arrays are turned
into tensors first), and for batches this small that costs more than making them: on the 2-core test machine
a worker with no work at all delivers ~250 batches/s of seven (32, 128) tensors and ~1,000 of one tensor,
but ~4,000 batches/s when the same bytes travel pickled through the worker's result pipe. So workers yield a
PackedBatch and PretrainingDataLoader hands the training loop the usual dict of tensors: views into one int64
buffer (pinned as a whole when pin_memory is on).
"""
from __future__ import annotations

import math

import numpy as np
import torch


class PackedBatch:
    """Every field as int64, flattened, back to back in `data`; `layout` holds (name, shape) per field."""

    def __init__(self, data: bytearray | torch.Tensor, layout: tuple[tuple[str, tuple[int, ...]], ...]):
        # A plain class, not a dataclass or tuple: DataLoader's default_convert must pass it through untouched
        # (it would turn a bytearray, a Sequence, into a list of ints).
        self.data = data
        self.layout = layout

    @classmethod
    def pack(cls, arrays: dict[str, np.ndarray]) -> PackedBatch:
        data = bytearray(8 * sum(array.size for array in arrays.values()))
        flat = np.frombuffer(data, dtype=np.int64)
        offset = 0
        for array in arrays.values():
            flat[offset:offset + array.size] = array.ravel()
            offset += array.size
        return cls(data, tuple((name, tuple(array.shape)) for name, array in arrays.items()))

    def unpack(self) -> dict[str, torch.Tensor]:
        pinned = isinstance(self.data, torch.Tensor)
        # Unpinned: slicing in numpy and wrapping each piece is ~3x cheaper than slicing a tensor (this runs in
        # the training process, once per batch). Pinned: tensor views, which keep the pinned storage.
        flat = self.data if pinned else np.frombuffer(self.data, dtype=np.int64)
        fields, offset = {}, 0
        for name, shape in self.layout:
            size = math.prod(shape)
            piece = flat[offset:offset + size]
            fields[name] = piece.view(shape) if pinned else torch.from_numpy(piece.reshape(shape))
            offset += size
        return fields

    def pin_memory(self, device: str | torch.device | None = None) -> PackedBatch:
        """Called by the DataLoader's pin-memory thread."""
        flat = self.data
        if not isinstance(flat, torch.Tensor):
            flat = torch.from_numpy(np.frombuffer(flat, dtype=np.int64))
        return PackedBatch(flat.pin_memory(device) if device else flat.pin_memory(), self.layout)
