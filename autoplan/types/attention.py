"""FLOPs a fused attention kernel executes: the tiles of the Q x K^T score matrix it visits (the
discussion: docs/cost-model.md, "Fused attention").

FlashAttention-2/3 and cuDNN walk the scores in T x T tiles (T = 128: Dao 2023, FlashAttention-2
section 3.1.1, "we skip the computation of blocks where all column indices are more than the row
indices"; Shah et al. 2024, FlashAttention-3 section 3, the same block skipping on Hopper). A
query block of ``rows`` queries whose visible keys span ``[lo, hi]`` runs the key tiles
``lo // T .. hi // T``, each ``T`` keys wide (the last one clipped to ``kv_len``):

    executed(q, k) = sum over query blocks of rows * min(k, tiles * T)
    fraction       = executed / (q k)                    (1 with no mask: every tile)

Query i sees keys ``i + k - q - w + 1 .. i + k - q`` (causal, aligned to the last key as FA2 >= 2.1
and SDPA's ``is_causal`` with q = k) for a sliding window of ``w`` keys (Mistral/GPT-OSS), or
``.. i + k - q`` without one. For q = k = s a multiple of T, causal: ``(1/2)(1 + T/s)``; window
w << s: about ``(w + T)/s``. An explicit ``attn_mask`` cannot skip tiles (the kernel reads the mask
for every tile), so it is priced full, fraction 1, whatever the mask holds. The model FLOPs (MFU,
autoplan/trace/flops.py) stay the full rectangle; only the priced time uses the fraction.
"""

from __future__ import annotations

from collections.abc import Mapping

#: FlashAttention-2/3's key and query tile (Dao 2023 section 3.1.1; FA3's kBlockN for head_dim 128)
FLASH_TILE = 128


def executed_fraction(attrs: Mapping, *, tile: int = FLASH_TILE) -> float:
    """The share of the ``q_len x kv_len`` scores a fused kernel computes (module docstring), from an
    attention node's attrs: ``q_len``, ``kv_len``, ``causal``, ``has_mask``, ``window`` (0/absent: none)."""
    q, k = int(attrs.get("q_len") or 0), int(attrs.get("kv_len") or 0)
    window = int(attrs.get("window") or 0)
    causal = bool(attrs.get("causal"))
    if q <= 0 or k <= 0 or attrs.get("has_mask") or (not causal and not window):
        return 1.0
    return _visited_scores(q, k, causal=causal, window=window, tile=tile) / (q * k)


def _visited_scores(q: int, k: int, *, causal: bool, window: int, tile: int) -> int:
    """Scores in the key tiles each query block visits (module docstring's sum)."""
    offset = k - q  # query i's last visible key under a causal mask is i + offset
    visited = 0
    for first in range(0, q, tile):
        last = min(first + tile, q) - 1
        hi = min(k - 1, last + offset) if causal else min(k - 1, last + offset + window - 1)
        lo = max(0, first + offset - window + 1) if window else 0
        if hi < lo:
            continue
        tiles = hi // tile - lo // tile + 1
        visited += (last - first + 1) * min(k, tiles * tile)
    return visited
