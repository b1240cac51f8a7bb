"""The decode loop's cache worked in place (backends/decode.py ``_GrowingLayer``), as pure tensor
logic: after any sequence of decode steps, joins (narrower and wider), leaves and trims, its keys
and values equal what concatenating and indexing whole tensors gives, and nothing is reallocated
while the buffer has room."""

from __future__ import annotations

import pytest
import torch

from rollstream.consumers.generator.backends.decode import _GrowingLayer, _pad_left

H, D = 2, 3


def _layer() -> _GrowingLayer:
    return _GrowingLayer()


def _kv(rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(rows, H, width, D), torch.randn(rows, H, width, D)


@pytest.mark.unit
def test_in_place_cache_matches_whole_tensor_operations() -> None:
    torch.manual_seed(0)
    layer = _layer()
    keys, values = _kv(3, 5)
    layer.update(keys, values)  # a prefill
    ref_k, ref_v = keys.clone(), values.clone()

    def decode_step() -> None:
        nonlocal ref_k, ref_v
        k, v = _kv(ref_k.shape[0], 1)
        layer.update(k, v)
        ref_k, ref_v = torch.cat([ref_k, k], 2), torch.cat([ref_v, v], 2)

    def join(rows: int, width: int) -> None:
        nonlocal ref_k, ref_v
        k, v = _kv(rows, width)
        layer.join(k, v)
        w = max(ref_k.shape[2], width)
        ref_k = torch.cat([_pad_left(ref_k, w, 2), _pad_left(k, w, 2)])
        ref_v = torch.cat([_pad_left(ref_v, w, 2), _pad_left(v, w, 2)])

    def keep(order: list[int]) -> None:
        nonlocal ref_k, ref_v
        layer.keep(order)
        ref_k, ref_v = ref_k[order], ref_v[order]

    for _ in range(4):
        decode_step()
    join(2, 4)  # narrower than the layer: the new rows padded
    decode_step()
    join(1, 30)  # wider: the live rows padded on the left
    decode_step()
    keep([0, 5, 2, 3])  # rows 1 and 4 left: the last kept row fills the first gap
    layer.trim(2)
    ref_k, ref_v = ref_k[:, :, 2:], ref_v[:, :, 2:]
    for _ in range(40):  # past the spare columns: a reallocation keeps everything
        decode_step()
    assert torch.equal(layer.keys, ref_k) and torch.equal(layer.values, ref_v)
    assert torch.isfinite(layer.keys).all()  # the padding is zeros, not whatever the buffer held


@pytest.mark.unit
def test_steps_joins_and_leaves_within_capacity_do_not_reallocate() -> None:
    layer = _layer()
    layer.update(*_kv(8, 40))
    buffer = layer._kbuf
    assert buffer is not None and buffer.shape[0] > 8 and buffer.shape[2] > 41
    layer.update(*_kv(8, 1))
    layer.keep([0, 1, 2, 7, 4, 5])
    layer.join(*_kv(2, 20))  # into the spare rows freed by the leave, narrower: no widening
    layer.trim(1)
    layer.update(*_kv(8, 1))
    assert layer._kbuf is buffer  # the same buffer throughout
    assert layer.keys.shape == (8, H, 41, D)


@pytest.mark.unit
def test_keys_replaced_from_outside_are_taken_into_a_new_buffer() -> None:
    """``reorder_cache`` (a shared prefill copied to each of its rows) sets the keys from outside."""
    layer = _layer()
    keys, values = _kv(2, 6)
    layer.update(keys, values)
    layer.reorder_cache(torch.tensor([0, 0, 1]))
    k, v = _kv(3, 1)
    layer.update(k, v)
    assert torch.equal(layer.keys, torch.cat([keys[[0, 0, 1]], k], 2))
    assert torch.equal(layer.values, torch.cat([values[[0, 0, 1]], v], 2))
