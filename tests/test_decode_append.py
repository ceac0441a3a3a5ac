"""`decode.kv_append` (flash_attn_with_kvcache's in-place append, one launch) against a plain-torch reference.

The reference writes each new key row by row into a copy of the cache; the kernel's caches must equal it
bitwise everywhere (written slots hold the new values, every other element is untouched: the caches are
random, never zeros). CPU under TRITON_INTERPRET=1 at small shapes; the GPU tests at the end take the
compiled kernel and its direct launch.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from attnscope.errors import InputError  # noqa: E402
from attnscope.kernels import decode  # noqa: E402
from attnscope.kernels.decode import kv_append  # noqa: E402
from kernel_env import kernel_device  # noqa: E402

fai = pytest.importorskip("attnscope.flash_attn_interface")

DEVICE = kernel_device()
DT = torch.bfloat16


def _rnd(*shape, g, dtype=DT):
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype).to(DEVICE)


def _reference(k_cache, v_cache, k, v, lens, table=None):
    """Plain torch: the caches after the append, and the lengths out. A sequence is written only if all its
    new keys fit in [0, capacity) and (paged) every page they go to is in [0, num_pages)."""
    kc, vc = k_cache.clone(), v_cache.clone()
    B, n_new = k.shape[:2]
    lens = [lens] * B if isinstance(lens, int) else lens
    page = kc.shape[1] if table is not None else None
    capacity = table.shape[1] * page if table is not None else kc.shape[1]
    out = []
    for b in range(B):
        n = int(lens[b])
        if n < 0 or n + n_new > capacity:
            out.append(-1)
            continue
        out.append(n + n_new)
        if table is not None:
            pages = [int(table[b, p // page]) for p in range(n, n + n_new)]
            if any(not 0 <= x < kc.shape[0] for x in pages):
                continue
            for j, x in enumerate(pages):
                kc[x, (n + j) % page], vc[x, (n + j) % page] = k[b, j], v[b, j]
        else:
            kc[b, n:n + n_new], vc[b, n:n + n_new] = k[b], v[b]
    return kc, vc, torch.tensor(out, dtype=torch.int32, device=DEVICE)


def _paged_cache(num_pages, page, hkv, d, B, max_pages, g):
    kc, vc = _rnd(num_pages, page, hkv, d, g=g), _rnd(num_pages, page, hkv, d, g=g)
    perm = torch.randperm(num_pages, generator=g)[:B * max_pages]
    return kc, vc, perm.view(B, max_pages).to(torch.int32).to(DEVICE)


def _check(kc, vc, k, v, lens, table=None):
    """kv_append equals the reference on copies of the caches; returns the lengths out."""
    want_k, want_v, want_lens = _reference(kc, vc, k, v, lens, table)
    got = kv_append(kc, vc, k, v, lens, table)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    assert torch.equal(got, want_lens), (got, want_lens)
    return got


@pytest.mark.parametrize("n_new", [1, 3, 17])
@pytest.mark.parametrize("as_int", [False, True])
def test_dense_ragged(n_new, as_int):
    g = torch.Generator().manual_seed(n_new)
    B, L, hkv, d = 3, 40, 2, 64
    kc, vc = _rnd(B, L, hkv, d, g=g), _rnd(B, L, hkv, d, g=g)
    k, v = _rnd(B, n_new, hkv, d, g=g), _rnd(B, n_new, hkv, d, g=g)
    lens = L - n_new if as_int else torch.tensor([0, 7, L - n_new], dtype=torch.int32, device=DEVICE)
    _check(kc, vc, k, v, lens)


@pytest.mark.parametrize("n_new", [1, 5, 40])
def test_paged_ragged_across_pages(n_new):
    """New keys that cross page boundaries (5 keys from position 14 of pages of 16; 40 keys over 3 pages)
    go to the pages the table names, in its order."""
    g = torch.Generator().manual_seed(10 + n_new)
    B, page, max_pages, hkv, d = 3, 16, 4, 2, 64
    kc, vc, table = _paged_cache(B * max_pages + 2, page, hkv, d, B, max_pages, g)
    k, v = _rnd(B, n_new, hkv, d, g=g), _rnd(B, n_new, hkv, d, g=g)
    starts = [0, 14, 64 - n_new]
    _check(kc, vc, k, v, torch.tensor(starts, dtype=torch.int32, device=DEVICE), table)
    _check(kc, vc, k, v, 14, table)  # an int length


def test_many_heads_odd_head_dim_and_strided_inputs():
    """Hkv past one program's head block (20 = 16 + 4) and d = 40 (padded to 64, masked); k and v are
    non-contiguous slices and the cache a view with a gap between sequences: written through their
    strides, nothing else touched."""
    g = torch.Generator().manual_seed(3)
    B, L, hkv, d, n_new = 2, 24, 20, 40, 2
    big_k, big_v = _rnd(B + 1, L + 3, hkv, d, g=g), _rnd(B + 1, L + 3, hkv, d, g=g)
    kc, vc = big_k[1:, 2:L + 2], big_v[1:, 2:L + 2]  # [B, L, Hkv, d] views
    k, v = _rnd(B, 3 * n_new, hkv, d, g=g)[:, ::3], _rnd(B, n_new + 1, hkv, d, g=g)[:, 1:]
    before_k, before_v = big_k.clone(), big_v.clone()
    lens = torch.tensor([5, 22], dtype=torch.int32, device=DEVICE)
    _check(kc, vc, k, v, lens)
    mask = torch.ones(big_k.shape, dtype=torch.bool, device=DEVICE)
    mask[1:, 2:L + 2] = False  # outside the view: untouched
    assert torch.equal(big_k[mask], before_k[mask]) and torch.equal(big_v[mask], before_v[mask])


@pytest.mark.parametrize("paged", [False, True])
def test_strided_lengths_are_read_through_their_stride(paged):
    """A cache_seqlens view with a stride (every other entry of a longer tensor) gives what its contiguous
    copy gives: the lengths are read at their strides, not as if packed."""
    g = torch.Generator().manual_seed(31)
    B, hkv, d, n_new = 3, 2, 64, 2
    if paged:
        kc, vc, table = _paged_cache(B * 3 + 1, 16, hkv, d, B, 3, g)
    else:
        (kc, vc), table = (_rnd(B, 48, hkv, d, g=g) for _ in range(2)), None
    k, v = _rnd(B, n_new, hkv, d, g=g), _rnd(B, n_new, hkv, d, g=g)
    padded = torch.tensor([5, -7, 20, 999, 46], dtype=torch.int32, device=DEVICE)  # the others: out of range
    got = _check(kc, vc, k, v, padded[::2], table)
    assert got.tolist() == [7, 22, 48]


def test_lengths_out_of_range_are_not_written():
    """Lengths below 0 or without room for the new keys (23 + 2 > 24; 24; 2**30) write nothing and give
    length -1; the sequences that fit are written."""
    g = torch.Generator().manual_seed(4)
    B, L, hkv, d, n_new = 6, 24, 2, 64, 2
    kc, vc = _rnd(B, L, hkv, d, g=g), _rnd(B, L, hkv, d, g=g)
    k, v = _rnd(B, n_new, hkv, d, g=g), _rnd(B, n_new, hkv, d, g=g)
    lens = torch.tensor([-1, 23, 24, 2**30, 22, 0], dtype=torch.int32, device=DEVICE)
    got = _check(kc, vc, k, v, lens)
    assert got.tolist() == [-1, -1, -1, -1, 24, 2]


def test_bad_block_table_entries_are_not_written():
    """A sequence whose new keys would go to a page outside [0, num_pages) (negative, num_pages, past it;
    the second of the two pages a 4-key append crosses) writes none of them, not even into its good first
    page; its length out is its length + Nnew (the decode kernel meets the entry and records it). A bad
    entry the new keys do not touch changes nothing."""
    g = torch.Generator().manual_seed(5)
    B, page, max_pages, hkv, d, n_new = 5, 16, 3, 2, 64, 4
    kc, vc, table = _paged_cache(B * max_pages, page, hkv, d, B, max_pages, g)
    num_pages = kc.shape[0]
    table[0, 0] = -1
    table[1, 1] = num_pages
    table[2, 1] = 2**31 - 1  # the second page of keys 14 .. 17
    table[3, 2] = -7  # not touched by keys 14 .. 17
    k, v = _rnd(B, n_new, hkv, d, g=g), _rnd(B, n_new, hkv, d, g=g)
    lens = torch.tensor([3, 20, 14, 14, 14], dtype=torch.int32, device=DEVICE)
    got = _check(kc, vc, k, v, lens, table)
    assert got.tolist() == [7, 24, 18, 18, 18]


@pytest.mark.parametrize("paged", [False, True])
def test_with_kvcache_records_what_it_did_not_write(paged):
    """Through flash_attn_with_kvcache (GQA 4 / 2): an out-of-range length and (paged) a bad page entry are
    reported by decode.check_errors after the call; the good sequences are appended."""
    g = torch.Generator().manual_seed(6)
    B, hq, hkv, d = 2, 4, 2, 64
    q = _rnd(B, 1, hq, d, g=g)
    k, v = _rnd(B, 1, hkv, d, g=g), _rnd(B, 1, hkv, d, g=g)
    if paged:
        kc, vc, table = _paged_cache(6, 16, hkv, d, B, 3, g)
        table[1, 1] = 99
        lens, match = torch.tensor([5, 20], dtype=torch.int32, device=DEVICE), "block_table"
    else:
        kc, vc, table = _rnd(B, 32, hkv, d, g=g), _rnd(B, 32, hkv, d, g=g), None
        lens, match = torch.tensor([5, 32], dtype=torch.int32, device=DEVICE), "cache_seqlens"
    want_k, want_v, _ = _reference(kc, vc, k, v, lens, table)
    decode.check_errors()  # nothing pending
    fai.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, block_table=table)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    with pytest.raises(InputError, match=match):
        decode.check_errors()


def test_no_new_keys_and_no_sequences():
    g = torch.Generator().manual_seed(7)
    kc, vc = _rnd(2, 8, 1, 64, g=g), _rnd(2, 8, 1, 64, g=g)
    before = kc.clone()
    lens = torch.tensor([3, 9], dtype=torch.int32, device=DEVICE)
    got = kv_append(kc, vc, kc[:, :0], vc[:, :0], lens)
    assert got.tolist() == [3, -1] and torch.equal(kc, before)
    assert kv_append(kc[:0], vc[:0], kc[:0, :1], vc[:0, :1], 2).shape == (0,)


@pytest.mark.parametrize("lens, match", [
    (None, "cache_seqlens: expected the current cache lengths"),
    (-1, "cache_seqlens: expected the current cache lengths .* got -1"),
    (True, "cache_seqlens: expected .* got True"),
    (7, "cache_seqlens: expected cache_seqlens \\+ Nnew <= 8 .* got 7 \\+ 2"),
    ("int64", "cache_seqlens: expected an int32 tensor \\[B = 2\\]"),
    ("stride", "k: expected unit stride in the last"),
    ("grad", "k: decode has no backward"),
])
def test_refused_before_writing(lens, match):
    g = torch.Generator().manual_seed(8)
    kc, vc = _rnd(2, 8, 2, 64, g=g), _rnd(2, 8, 2, 64, g=g)
    k, v = _rnd(2, 2, 2, 64, g=g), _rnd(2, 2, 2, 64, g=g)
    if lens == "int64":
        lens = torch.tensor([1, 2], device=DEVICE)
    elif lens == "stride":
        k, lens = _rnd(2, 2, 2, 128, g=g)[..., ::2], 1
    elif lens == "grad":
        k, lens = k.float().requires_grad_().to(DT), 1
    before = kc.clone()
    with pytest.raises((InputError, NotImplementedError), match=match):
        kv_append(kc, vc, k, v, lens)
    assert torch.equal(kc, before)


def test_torch_compile_fullgraph_and_opcheck():
    """flash_attn_with_kvcache with new k/v inside torch.compile(fullgraph=True): the append is the
    mutating custom op ``attnscope::kv_append`` (functionalised by aot_eager), then the decode op; the
    compiled step writes the same caches and returns the same output as the eager one."""
    g = torch.Generator().manual_seed(9)
    B, L, hq, hkv, d = 2, 32, 4, 2, 64
    q = _rnd(B, 1, hq, d, g=g)
    kc, vc = _rnd(B, L, hkv, d, g=g), _rnd(B, L, hkv, d, g=g)
    k, v = _rnd(B, 1, hkv, d, g=g), _rnd(B, 1, hkv, d, g=g)
    lens = torch.tensor([4, 30], dtype=torch.int32, device=DEVICE)

    def step(q, kc, vc, k, v, lens):
        return fai.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, causal=True).float() * 2

    kc_e, vc_e = kc.clone(), vc.clone()
    want = step(q, kc_e, vc_e, k, v, lens)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")  # fullgraph: a break raises
    got = compiled(q, kc, vc, k, v, lens)
    assert torch.equal(kc, kc_e) and torch.equal(vc, vc_e) and torch.equal(got, want)
    torch._dynamo.reset()
    torch.library.opcheck(torch.ops.attnscope.kv_append.default, (kc, vc, k, v, lens, None, 0),
                          test_utils=("test_schema", "test_faketensor"))


# --- on a GPU: the compiled kernel, its direct launch, realistic sizes --------------------------------------
GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@GPU
@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True])
def test_gpu_repeated_calls_and_alignments(paged):
    """A decode loop's calls (the second on go through the kept binary, `_direct.DirectLaunch`), int and
    tensor lengths, and a k that is not 16-byte aligned (Triton's own launch): all equal the reference."""
    g = torch.Generator().manual_seed(11)
    B, hkv, d = 8, 8, 128
    if paged:
        kc, vc, table = _paged_cache(B * 64 + 3, 64, hkv, d, B, 64, g)
    else:
        kc, vc, table = _rnd(B, 4096, hkv, d, g=g), _rnd(B, 4096, hkv, d, g=g), None
    lens = torch.randint(0, 4000, (B,), generator=g, dtype=torch.int32).to(DEVICE)
    for step in range(4):
        for n_new in (1, 17):
            k, v = _rnd(B, n_new, hkv, d, g=g), _rnd(B, n_new, hkv, d, g=g)
            _check(kc, vc, k, v, lens, table)
            _check(kc, vc, k, v, 100 + step, table)
        lens += 1
    odd = _rnd(B + 1, 1, hkv, d, g=g).flatten()[1:1 + B * hkv * d].view(B, 1, hkv, d)  # 2 bytes off
    _check(kc, vc, odd, odd, lens, table)
