"""Check exported `sagemaker-v1` distributions with SageMaker Python SDK v2's own SMP v1 checks.

One list a line, one PLANNER-RESULT line each, until stdin closes (_serve.py).
stdin: JSON list of {"text": exported JSON}. stdout: JSON list of {"ok": true, "config": {...}} or
{"ok": false, "error": "..."}.

SDK v2 (sagemaker 2.257.7, installed without its ~40 dependencies) checks model-parallel parameters
in `sagemaker.fw_utils.get_mp_parameters` -> `validate_mp_config`, two functions that use nothing but
`os`, `json` and builtins. Importing `sagemaker.fw_utils` would import the whole SDK v2, so this script
compiles just those two functions from the installed wheel's fw_utils.py (read at run time, not copied).
"""

import ast
import json
import os
import pathlib


def _sdk_v2_functions(*names):
    import importlib.util

    spec = importlib.util.find_spec("sagemaker")
    source = pathlib.Path(spec.submodule_search_locations[0], "fw_utils.py").read_text()
    tree = ast.parse(source)
    wanted = [
        node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names
    ]
    if len(wanted) != len(names):
        raise RuntimeError(f"sagemaker v2 fw_utils.py lacks {names}")
    namespace = {"os": os, "json": json}
    exec(
        compile(ast.Module(body=wanted, type_ignores=[]), "sagemaker/fw_utils.py", "exec"),
        namespace,
    )
    return [namespace[n] for n in names]


get_mp_parameters, validate_mp_config, parse_mp_parameters = _sdk_v2_functions(
    "get_mp_parameters", "validate_mp_config", "parse_mp_parameters"
)


def check(item):
    try:
        distribution = json.loads(item["text"])
        get_mp_parameters.__globals__["parse_mp_parameters"] = parse_mp_parameters
        get_mp_parameters.__globals__["validate_mp_config"] = validate_mp_config
        params = get_mp_parameters(distribution)
        if params is None:
            raise ValueError("modelparallel is not enabled")
        return {"ok": True, "config": {"parameters": params, "mpi": distribution.get("mpi")}}
    except BaseException as err:
        return {"ok": False, "error": f"{type(err).__name__}: {err}"[:2000]}


if __name__ == "__main__":
    from _serve import serve

    serve(lambda items, first: [check(item) for item in items])
