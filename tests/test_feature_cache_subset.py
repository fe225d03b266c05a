"""One feature cache serves heads that read different layer sets (a column subset per head)."""
import json

import numpy as np
import pytest
import torch

from peagle.train.data.features import FeatureCache


def _write_cache(root, layers, H=4, lens=(3, 2)):
    d = root / "00000"
    d.mkdir(parents=True)
    T = sum(lens)
    # Column block j holds layer layers[j]; value = 10 * layer + token index, exact in bf16.
    aux = torch.stack([torch.arange(T, dtype=torch.float32)[:, None].expand(T, H) + 10 * layer for layer in layers], 1)
    aux = aux.reshape(T, len(layers) * H).to(torch.bfloat16).view(torch.uint16).numpy()
    fin = torch.ones(T, H, dtype=torch.bfloat16).view(torch.uint16).numpy()
    np.save(d / "aux.npy", aux)
    np.save(d / "final.npy", fin)
    offsets = np.concatenate([[0], np.cumsum(lens)]).tolist()
    (d / "meta.json").write_text(json.dumps({"aux_layer_ids": list(layers), "hidden_size": H, "offsets": offsets}))


def test_subset_of_cached_layers_in_the_heads_order(tmp_path):
    _write_cache(tmp_path, [2, 9, 15])
    aux, fin = FeatureCache(tmp_path, aux_layer_ids=(2, 15)).get(0, 1)
    assert aux.shape == (2, 8) and fin.shape == (2, 4)
    assert aux[:, :4].float().eq(torch.tensor([[23.0], [24.0]])).all()  # row 1 = tokens 3, 4
    assert aux[:, 4:].float().eq(torch.tensor([[153.0], [154.0]])).all()
    full, _ = FeatureCache(tmp_path).get(0, 0)
    assert full.shape == (3, 12)


def test_a_layer_the_cache_lacks_is_a_clear_error(tmp_path):
    _write_cache(tmp_path, [2, 9, 15])
    with pytest.raises(ValueError, match="aux layers"):
        FeatureCache(tmp_path, aux_layer_ids=(2, 27))
