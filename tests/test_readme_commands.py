"""README's commands run as written (STYLE.md: "Its commands run as written"): every command of the
"Explain" block and every `bytes --estimate-only` line of the "Measure" block exits 0 on a CPU, imports
neither torch nor triton, and prints the numbers its comment quotes."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

# A comment's quoted numbers and the text the command prints for them.
QUOTED = {
    "footprint": [("64 MiB/head", "64.00 MiB"), ("2.0 GiB layer peak", "2.00 GiB"),
                  ("64.0 GiB training", "64.00 GiB")],
    "tiles --query-tile 5": [("rows 513..640", "rows 513..640"), ("load KV tiles 1..10", "KV tiles 1..10"),
                             ("mask 9 and 10", "KV tiles 9..10"), ("skip 11..64", "KV tiles 11..64")],
    "amdahl --f 0.15 --s 3.5": [("1.120x", "1.120x"), ("10.71 %", "10.71 %"), ("15/40/65 %", "65 %")],
    "trace": [("O = [4.6025, 5.6025]", "O = acc / l = [4.6025, 5.6025]")],
}

# Needs a GPU or the Triton interpreter (tests/test_checks.py runs it), or a file of the reader's.
SKIP = {"verify --kernels on", "trace --input row.json"}


def _block(title: str) -> list[str]:
    body = README.split(f"**{title}", 1)[1].split("```", 2)[1]
    cmds = []
    for line in body.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("attnscope "):
            cmds.append(line[len("attnscope "):])
    return cmds


def _commands() -> list[str]:
    explain = [c for c in _block("Explain") if c not in SKIP]
    estimate = [c for c in _block("Measure") if "--estimate-only" in c]
    return explain + estimate


_DRIVER = """
import contextlib, io, json, shlex, sys
from attnscope.cli import main
res = {}
for cmd in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            rc = main(shlex.split(cmd))
        except SystemExit as e:
            rc = e.code
    res[cmd] = [rc, buf.getvalue()]
heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton'))
print(json.dumps({"res": res, "heavy": heavy}))
"""


def test_readme_cpu_commands_run_as_written_without_torch():
    cmds = _commands()
    assert len(cmds) >= 20, cmds
    r = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(cmds)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env={"PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200",
                                                    "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.splitlines()[-1])
    failed = {c: out[-300:] for c, (rc, out) in got["res"].items() if rc != 0}
    assert not failed, failed
    assert got["heavy"] == [], got["heavy"][:5]
    for cmd, pairs in QUOTED.items():
        line = next(ln for ln in README.splitlines() if re.match(rf"attnscope {re.escape(cmd)}\s+#", ln))
        out = got["res"][cmd][1]
        for quote, printed in pairs:
            assert quote in line, (cmd, quote)
            assert printed in out, (cmd, printed)


def test_the_measure_block_names_no_command_the_cli_lacks():
    from attnscope.cli import main

    for cmd in _block("Measure"):
        name = shlex.split(cmd)[0]
        try:
            main([name, "--help"])
        except SystemExit as e:
            assert e.code == 0, name
