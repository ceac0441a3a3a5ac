import importlib.util, sys
sys.path.insert(0, "bench")
spec = importlib.util.spec_from_file_location("res", "bench/sm90_resources.py")
res = importlib.util.module_from_spec(spec); spec.loader.exec_module(res)
from attnscope.kernels import bwd, varlen, varlen_bwd
from attnscope.kernels.decode import _kernel, heuristics
import triton
dt = "bf16"
def rep(label, *a, **kw):
    try:
        k = res.compile_triton(*a, **kw)
        print("OK ", label, "regs", k.n_regs if hasattr(k, "n_regs") else "?", flush=True)
    except Exception as e:
        print("FAIL", label, type(e).__name__, str(e)[:300], flush=True)
for causal in (False, True):
    mods = dict(CAUSAL=causal, WINDOW=False, SOFTCAP=False)
    for atomic in (False, True):
        bm, bn, w, s = bwd.dkdv_config(128, atomic)
        cx = dict(HEAD_DIM=128, D=96, ATOMIC_DQ=atomic, BLOCK_M=bm, BLOCK_N=bn, EMULATE_BF16=False, **mods)
        rep(f"bwd dkdv d96 causal={causal} atomic={atomic}", bwd._attnscope_bwd_dkdv_kernel, res._bwd_types(dt, True), cx, w, s)
    bm, bn, w, s = bwd.DQ_CONFIGS[128]
    rep(f"bwd dq d96 causal={causal}", bwd._attnscope_bwd_dq_kernel, res._bwd_types(dt, False),
        dict(HEAD_DIM=128, D=96, BLOCK_M=bm, BLOCK_N=bn, EMULATE_BF16=False, **mods), w, s)
    bm, bn, w, s = varlen.pick_config(128, causal, 1)
    for tma in (True, False):
        cx = dict(HEAD_DIM=128, D=96, STORE_LSE=True, BLOCK_M=bm, BLOCK_N=bn, USE_TMA=tma, MAX_UNSCALED=False,
                  EMULATE_BF16=False, HAS_SINKS=False, **mods)
        desc = f"tensordesc<{dt}[{bn},1,128]>" if tma else f"*{dt}"
        rep(f"varlen fwd d96 causal={causal} tma={tma}", varlen._attnscope_varlen_kernel,
            {**res._varlen_types(dt, False), "desc_k": desc, "desc_v": desc}, cx, w, s)
    bm, bn, w, s = bwd.dkdv_config(128, False)
    rep(f"varlen dkdv d96 causal={causal}", varlen_bwd._attnscope_varlen_dkdv_kernel, res._varlen_types(dt, True),
        dict(HEAD_DIM=128, D=96, ATOMIC_DQ=False, BLOCK_M=bm, BLOCK_N=bn, EMULATE_BF16=False, **mods), w, s)
rep("bwd preprocess d96", bwd._attnscope_bwd_preprocess, {"O": "*bf16", "DO": "*bf16", "LSE": "*fp32", "DLSE": "*fp32", "DELTA": "*fp32", "LSE2": "*fp32", "ROW0": "*fp32", "ROW1": "*fp32", "row0_mul": "fp32", "row0_add": "fp32", "row1_mul": "fp32"},
    dict(HEAD_DIM=128, D=96, BLOCK_M=bwd.PRE_BLOCK_M, HAS_DLSE=False, PADDED=False), 4, 1)
for block_m, page, chunk in ((16, 0, False), (16, 64, False), (64, -1, True)):
    if page < 0:
        page = heuristics._block_config(block_m, head_dim=128)["BLOCK_N"]
    cfg = heuristics._block_config(block_m, page, False, head_dim=128)
    rows = block_m if chunk else 4
    merge_m = min(block_m, triton.next_power_of_2(rows))
    cx = dict(GROUP=4, BLOCK_M=block_m, HEAD_DIM=128, D=96, BLOCK_N=cfg["BLOCK_N"], STAGES=cfg["STAGES"], USE_DOT=True,
              EMULATE_BF16=False, SPLIT=True, FUSE=True, MERGE_M=merge_m, MERGE_S=max(1, min(8, heuristics.MERGE_ELEMS // merge_m // 128)),
              WRITE_LSE=True, HAS_SEQLENS=True, PAGED=page > 0, PAGE_SIZE=max(page, 1), CHUNK=chunk, OFF32=True)
    rep(f"decode split d96 block_m={block_m} page={page}", _kernel._attnscope_decode_split_kernel, res._decode_types("*bf16"), cx,
        cfg["num_warps"], cfg["num_stages"], ("STARTS",))
rep("decode combine d96", _kernel._attnscope_decode_combine_kernel, {"O_PART": "*fp32", "LSE_PART": "*fp32", "O": "*bf16", "LSE": "*fp32", "SINKS": "*fp32"},
    dict(HEAD_DIM=128, D=96, BLOCK_S=16, EMULATE_BF16=False, HAS_SINKS=False), 4, 1)
