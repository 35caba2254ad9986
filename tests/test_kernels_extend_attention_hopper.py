"""The warp-specialized Hopper extend kernel (Gluon): compiled for sm_90 here, run on the H200."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import triton

from radixgen.kernels.extend_attention import extend_attention, extend_attention_ref
from radixgen.kernels.extend_attention_hopper import HOPPER_GLUON, MIN_EXTEND_LEN
from tests.test_kernels_extend_attention import make_extend_case, relative_error

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def compile_for_sm90(consumers: int = 2, pingpong: bool = False) -> dict:
    """Builds the kernel for sm_90a with this machine's Triton (no GPU needed); run in a child
    process, as the interpreter (TRITON_INTERPRET=1, set for the tests) cannot compile Gluon."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    from radixgen.kernels import extend_attention_hopper as hopper

    tokens, heads, kv_heads, head_dim = 256, 4, 2, 128
    q = torch.zeros(tokens, heads, head_dim, dtype=torch.bfloat16)
    kv = torch.zeros(tokens, kv_heads, head_dim, dtype=torch.bfloat16)

    lens = torch.zeros(1, dtype=torch.int64)
    args = dict(
        q_desc=hopper.tma_descriptor(q, hopper.HALF_M),
        k_desc=hopper.tma_descriptor(kv, consumers * hopper.HALF_M),
        v_desc=hopper.tma_descriptor(kv, consumers * hopper.HALF_M),
        out_ptr=q,
        extend_lens_ptr=lens,
        extend_start_loc_ptr=lens,
        qk_scale=0.1,
        stride_out_token=heads * head_dim,
        batch=3,
        num_m_blocks=2,
    )
    constants = dict(
        NUM_HEADS=heads,
        GROUP_SIZE=heads // kv_heads,
        HEAD_DIM=head_dim,
        HALF_M=hopper.HALF_M,
        CONSUMERS=consumers,
        NUM_STAGES=hopper.NUM_STAGES,
        CONSUMER_REGS=hopper.CONSUMER_REGS,
        LOADER_REGS=hopper.LOADER_REGS,
        PINGPONG=pingpong,
    )
    kernel = hopper._hopper_extend_kernel
    signature = {
        p.name: "constexpr" if p.name in constants else mangle_type(args[p.name])
        for p in kernel.params
    }
    source = GluonASTSource(
        kernel, signature, {(kernel.arg_names.index(k),): v for k, v in constants.items()}
    )
    options = {"num_warps": 4, "maxnreg": hopper.MAX_REGISTERS[consumers]}
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.TemporaryDirectory() as tmp:  # registers, stack and spills of the cubin
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        cuobjdump = Path(triton.knobs.nvidia.ptxas.path).with_name("cuobjdump")
        usage = subprocess.run(
            [str(cuobjdump), "--dump-resource-usage", str(cubin)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    return dict(ptx=compiled.asm["ptx"], shared=compiled.metadata.shared, usage=usage.stdout)


@pytest.mark.skipif(not HOPPER_GLUON, reason="this Triton has no Gluon Hopper module")
@pytest.mark.parametrize("consumers,pingpong", [(1, False), (2, False), (2, True)])
def test_hopper_kernel_compiles_for_sm90_without_spills(consumers, pingpong):
    """One or two consumer warpgroups (by turns or not) and a loader warp, within the shared
    memory an H100/H200 block may take, no spills."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import json; from tests.test_kernels_extend_attention_hopper import compile_for_sm90;"
        f"print(json.dumps(compile_for_sm90({consumers}, {pingpong})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
        cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    ptx = report["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert "setmaxnreg" in ptx  # the loader warp gives its registers to the consumers
    assert ("bar.arrive" in ptx) == pingpong  # the turns on named barriers
    assert " STACK:0 " in report["usage"] and " LOCAL:0 " in report["usage"], report["usage"]
    assert report["shared"] <= 227 * 1024


def test_hopper_kernel_is_refused_where_it_does_not_apply():
    args = make_extend_case(
        prefix_lens=[0], extend_lens=[9], num_heads=2, num_kv_heads=1, head_dim=128,
        dtype=torch.float16,
    )  # fmt: skip
    with pytest.raises(ValueError, match="kernel='hopper' needs"):
        extend_attention(**args, max_prefix_len=0, kernel="hopper")  # CPU tensors
    with pytest.raises(ValueError, match="kernel must be"):
        extend_attention(**args, kernel="flash")


GPU_CASES = [
    # (extend_lens, num_heads, num_kv_heads)
    ([1024], 32, 8),
    ([1, 127, 128, 129, 300, 1000, 64], 32, 8),  # ragged, every tail shape
    ([4096, 5], 8, 1),
    ([257], 4, 4),  # MHA
]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("extend_lens,num_heads,num_kv_heads", GPU_CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_hopper_kernel_matches_reference(extend_lens, num_heads, num_kv_heads, dtype):
    args = make_extend_case(
        prefix_lens=[0] * len(extend_lens), extend_lens=extend_lens, num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=128, dtype=dtype, device="cuda",
    )  # fmt: skip
    ref = extend_attention_ref(**args)
    out = extend_attention(**args, max_prefix_len=0, kernel="hopper")
    assert relative_error(out, ref) < 1e-2
    triton_out = extend_attention(**args, kernel="triton")
    assert relative_error(out, triton_out) < 1e-2
    # The default takes the Hopper kernel for a prefix-free batch from MIN_EXTEND_LEN tokens,
    # the Triton kernel below: bit-identical to the one it took.
    took = out if args["max_extend_len"] >= MIN_EXTEND_LEN else triton_out
    assert torch.equal(extend_attention(**args, max_prefix_len=0), took)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm_90 GPU")
def test_hopper_kernel_reads_strided_projection_views():
    """k_new/v_new as the engine passes them: views into one fused QKV projection."""
    tokens, heads, kv_heads, d = 700, 32, 8, 128
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=1)
    args = make_extend_case(
        prefix_lens=[0, 0], extend_lens=[300, 400], num_heads=heads, num_kv_heads=kv_heads,
        head_dim=d, dtype=torch.bfloat16, device="cuda",
    )  # fmt: skip
    args.update(
        q=q.contiguous().view(tokens, heads, d),
        k_new=k.view(tokens, kv_heads, d),
        v_new=v.view(tokens, kv_heads, d),
    )
    out = extend_attention(**args, max_prefix_len=0, kernel="hopper")
    assert relative_error(out, extend_attention_ref(**args)) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("consumers,num_stages", [(1, 2), (1, 3), (1, 4), (2, 2), (2, 3)])
def test_hopper_kernel_launch_variants_match_reference(consumers, num_stages):
    from radixgen.kernels.extend_attention_hopper import hopper_extend_attention

    args = make_extend_case(
        prefix_lens=[0] * 4, extend_lens=[1, 129, 1000, 640], num_heads=32, num_kv_heads=8,
        head_dim=128, dtype=torch.bfloat16, device="cuda",
    )  # fmt: skip
    launches = [(False, False), (True, False)] + [(True, True), (False, True)] * (consumers == 2)
    outs = [
        hopper_extend_attention(
            args["q"],
            args["k_new"],
            args["v_new"],
            args["extend_lens"],
            args["extend_start_loc"],
            args["max_extend_len"],
            args["scaling"],
            torch.empty_like(args["q"]),
            consumers=consumers,
            num_stages=num_stages,
            persistent=persistent,
            pingpong=pingpong,
        )  # fmt: skip
        for persistent, pingpong in launches
    ]
    assert relative_error(outs[0], extend_attention_ref(**args)) < 1e-2
    # A persistent program runs each work item as a one-item program does, and the ping-pong
    # only orders the warpgroups' issues: the same bits.
    for out in outs[1:]:
        assert torch.equal(out, outs[0])
