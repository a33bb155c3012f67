"""qkv from Python: train small attention models and look inside them, at the C++ library's speed.

    import qkv
    qkv.train("rps", out="runs/rps", steps=300)     # as `qkv train rps --out runs/rps --steps 300`
    model = qkv.load_run("runs/rps")
    logits, cache = model.run_with_cache([[0, 1, 2, 3]])
    cache["blocks.0.attn.hook_pattern"]               # a numpy array, sharing qkv's memory

Arrays qkv returns share the tensors' memory and are read-only; an array qkv returned goes back
in (a hook's replacement) as the same tensor, without a copy. Errors are ValueError for bad
arguments and options, OSError for run folders and files, each with the library's message.
"""
from ._qkv import (EncoderDecoder, Hook, Task, Transformer, __version__, ablate, across_training, antisymmetry,
                   composition_score, detect_heads, evaluate, fourier, inspect, load_run, logit_attribution, ov_circuit,
                   patch, path_patch, position_table, qk_circuit, register_task, report_html, score_asymmetry,
                   spectrum, sweep, sweep_results, symmetric_share, task, tasks, token_table, train)

__all__ = ["EncoderDecoder", "Hook", "Task", "Transformer", "__version__", "ablate", "across_training",
           "antisymmetry", "composition_score", "detect_heads", "evaluate", "fourier", "inspect", "load_run",
           "logit_attribution", "ov_circuit", "patch", "path_patch", "position_table", "qk_circuit", "register_task",
           "report_html", "score_asymmetry", "spectrum", "sweep", "sweep_results", "symmetric_share", "task",
           "tasks", "to_torch", "token_table", "train"]


def to_torch(model):
    """The model as a torch.nn.Module (qkv/torch_export.py) holding copies of its parameters under
    qkv's names, whose logits equal qkv's within float32 rounding. Needs torch; `import qkv` does not."""
    from .torch_export import to_torch as convert
    return convert(model)
