"""Programmatic dependent launch from Gluon kernels (sm_90; kernels/device.py says how the kernels use it): Gluon
has no griddepcontrol builtin, so these emit the instructions."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def gdc_launch_dependents():
    """Programmatic dependent launch (sm_90): the next kernel of the stream may start as this one's CTAs retire."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def gdc_wait():
    """Programmatic dependent launch: wait until the previous kernel of the stream has completed (its writes
    visible)."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
