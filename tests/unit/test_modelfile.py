"""Every bad model file or untraceable model: one line on stderr, exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from autoplan.cli import main

GOOD_INPUTS = "def example_inputs(batch_size):\n    return (torch.randn(batch_size, 4),)\n"
CASES = {
    "syntax_error": "def build_model(:\n    pass\n",
    "import_error": "import not_a_real_module_xyz\n",
    "no_build_model": "import torch\n" + GOOD_INPUTS,
    "no_example_inputs": "import torch\ndef build_model():\n    return torch.nn.Linear(4, 4)\n",
    "build_returns_non_module": "import torch\ndef build_model():\n    return 42\n" + GOOD_INPUTS,
    "inputs_wrong_type": "import torch\ndef build_model():\n    return torch.nn.Linear(4, 4)\n"
    "def example_inputs(batch_size):\n    return 'tokens'\n",
    "build_raises": "import torch\ndef build_model():\n    raise RuntimeError('boom')\n" + GOOD_INPUTS,
    "untraceable": textwrap.dedent("""
        import torch
        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)
            def forward(self, x):
                if x.sum().item() > 0:
                    return self.lin(x)
                return x
        def build_model():
            return Model()
        """)
    + GOOD_INPUTS,
}
EXPECT = {
    "syntax_error": "SyntaxError",
    "import_error": "does not import",
    "no_build_model": "build_model()",
    "no_example_inputs": "example_inputs",
    "build_returns_non_module": "torch.nn.Module",
    "inputs_wrong_type": "expected a tuple",
    "build_raises": "boom",
    "untraceable": "could not trace",
}


def _run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.err


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_model_file(case, tmp_path, capsys):
    path = tmp_path / f"{case}.py"
    path.write_text("import torch\n" + CASES[case] if case != "syntax_error" else CASES[case])
    code, err = _run(["trace", str(path), "--batch", "2", "--out", str(tmp_path / "out")], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("autoplan: error:") and EXPECT[case] in err
    assert not (tmp_path / "out" / "graph.json").exists()


def test_untraceable_names_module_and_line(tmp_path, capsys):
    path = tmp_path / "model.py"
    path.write_text("import torch\n" + CASES["untraceable"])
    code, err = _run(["trace", str(path), "--batch", "2", "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "model.py:" in err and "x.sum().item()" in err


def test_missing_file_and_not_python(tmp_path, capsys):
    code, err = _run(["trace", str(tmp_path / "absent.py"), "--batch", "2", "--out", str(tmp_path)], capsys)
    assert code == 2 and "does not exist" in err
    other = tmp_path / "model.txt"
    other.write_text("x")
    code, err = _run(["trace", str(other), "--batch", "2", "--out", str(tmp_path)], capsys)
    assert code == 2 and "not a .py file" in err


def test_bad_batch(tmp_path, capsys):
    code, err = _run(["trace", "examples/gpt.py", "--batch", "0", "--out", str(tmp_path)], capsys)
    assert code == 2 and "batch" in err


def test_subprocess_prints_no_traceback(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text(CASES["import_error"])
    proc = subprocess.run(
        [sys.executable, "-m", "autoplan.cli", "trace", str(path), "--batch", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


HF_CHECKPOINTED = """
from transformers import LlamaConfig, LlamaForCausalLM
def build_model():
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2, use_cache=False))
    model.activation_checkpointing_enable()
    return model
def example_inputs(batch_size):
    import torch
    return (torch.zeros(batch_size, 8, dtype=torch.long),)
"""


def test_a_hugging_face_models_own_checkpointing_is_turned_off_for_the_plans(tmp_path):
    """The plan's recomputation is the one autoplan prices and runs; the model's own re-ran its blocks under context
    parallelism's attention routing with other saved tensors (CheckpointError on every cp plan)."""
    pytest.importorskip("transformers")
    from autoplan.modelfile import load_model_file

    path = tmp_path / "checkpointed.py"
    path.write_text(HF_CHECKPOINTED)
    model = load_model_file(path).build()
    assert not model.is_activation_checkpointing
