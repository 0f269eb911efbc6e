"""llama.cpp's OpenAI server (llama-cpp-python) without its extra CPU buffer types.

On this project's machines (Sapphire Rapids) llama.cpp 0.3.36 repacks weights for its AMX
kernels and then crashes in the first decode (gdb: ``ggml_backend_amx_mul_mat``).
llama.cpp's own ``--no-repack`` switch is not exposed by llama-cpp-python, so this turns
off ``use_extra_bufts`` in the model parameters every load starts from, then runs the
server with the same arguments as ``python -m llama_cpp.server``.

    LLAMA_VENV/bin/python scripts/llama_cpp_server.py --model M.gguf --port 8089 ...
"""

import runpy

import llama_cpp.llama_cpp as bindings

_default_params = bindings.llama_model_default_params


def _without_extra_buffers() -> bindings.llama_model_params:
    params = _default_params()
    params.use_extra_bufts = False
    return params


def disable_extra_buffers() -> None:
    """Every ``Llama(...)`` created after this call loads without extra buffer types."""
    bindings.llama_model_default_params = _without_extra_buffers


if __name__ == "__main__":
    disable_extra_buffers()
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
