"""kernels/precompile.py: launches that would compile are recorded and skipped, their kernels compiled by forked
workers into Triton's on-disk cache, where the real launch then finds them."""
import pytest
import torch
import triton
import triton.language as tl
from triton.compiler import ASTSource

from kernels.precompile import compile_ahead


@triton.jit
def _fill(x_ptr, V: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, 16), V)


def test_compile_ahead_does_not_nest():
    with pytest.raises(RuntimeError, match="already recording"):
        compile_ahead(lambda: compile_ahead(lambda: None))
    assert compile_ahead(lambda: None) == 0                    # and the first one restored the compiler


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compile_ahead_compiles_what_launches_need_and_skips_them(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))   # nothing compiled yet
    x = torch.zeros(16, device="cuda")
    launches = lambda: [_fill[(1,)](x, V=v) for v in (3.0, 3.0, 5.0)]
    assert compile_ahead(launches, processes=2) == 2           # two distinct kernels
    torch.cuda.synchronize()
    assert not x.any()                                         # their launches were skipped
    assert len(list(tmp_path.rglob("*.cubin"))) == 2           # the workers compiled both
    def no_compiling(*_):
        raise AssertionError("compiled in the launching process")
    monkeypatch.setattr(ASTSource, "make_ir", no_compiling)    # the compiler's first step on a cache miss
    _fill[(1,)](x, V=5.0)
    assert torch.equal(x, torch.full_like(x, 5.0))
