"""Triton 3.6's interpreter, less one redundant cost: every call of a ``@triton.jit`` helper from inside a
kernel re-runs ``_patch_lang`` (``inspect.getmembers`` over triton.language, its tensor class and math,
~0.8 ms), although the kernel's launch (`GridExecutor`) already patched those modules and restores them
only when the launch ends. The repeat is a no-op: the builtins are patched lambdas by then, so none is
patched again, and the few attributes it sets anew (``tensor.__index__``, ``range``, ...) get equivalent
functions. `install` skips it when every language module the helper sees (triton.language, its core) has
been patched since the last restore, and patches as before otherwise; the kernels run the same code.
About a quarter of a kernel test's time under the interpreter (tests/test_bwd.py: 36 s -> 26 s).
Nothing happens for another Triton version, off the interpreter, or if the internals differ."""

from __future__ import annotations

import os


def install() -> bool:
    """Patch the interpreter in this process (idempotent); whether it is patched."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    try:
        import triton
        import triton.runtime.interpreter as interp
    except ImportError:
        return False
    if getattr(interp, "_attnscope_fast_calls", False):
        return True
    if not triton.__version__.startswith("3.6.") or not all(
            hasattr(x, y) for x, y in ((interp, "_patch_lang"), (interp, "_LangPatchScope"),
                                       (interp, "InterpretedFunction"), (interp, "InterpreterError"),
                                       (interp._LangPatchScope, "restore"))):
        return False
    tl = interp.tl
    patched: set[int] = set()  # ids of the language modules patched since the last restore
    langs_of: dict = {}
    patch_lang, restore = interp._patch_lang, interp._LangPatchScope.restore

    def langs(fn) -> frozenset:  # the language modules `_patch_lang` would patch for fn
        got = langs_of.get(fn)
        if got is None:
            got = langs_of[fn] = frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)
        return got

    def counted_patch_lang(fn):
        scope = patch_lang(fn)
        patched.update(langs(fn))
        return scope

    def counted_restore(self):
        patched.clear()
        restore(self)

    def call(self, *args, **kwargs):  # InterpretedFunction.__call__ (a device function call), as in 3.6
        if not langs(self.fn) <= patched:
            counted_patch_lang(self.fn)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interp.InterpreterError(repr(e)) from e

    interp._patch_lang = counted_patch_lang
    interp._LangPatchScope.restore = counted_restore
    interp.InterpretedFunction.__call__ = call
    interp._attnscope_fast_calls = True
    return True
