"""Each activation's dtype in the run (autoplan/cost/compute/dtypes.py), on graphs from the real tracer:
the dtypes the cost model propagates are the dtypes torch.autocast produces when the same fx graph runs,
node by node, under the executor's two policies (docs/cost-model.md, "Activation dtypes")."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
from synthetic import synthetic_profile

from autoplan.cost.compute.dtypes import DtypePolicy, dtype_policy, run_dtypes
from autoplan.cost.compute.roofline import saved_activation_bytes
from autoplan.cost.model import CostModel
from autoplan.execute.data_parallel import dp_mode
from autoplan.execute.precision import policy_for
from autoplan.trace import trace
from autoplan.types.plan import Plan

DIM, SEQ, VOCAB, BATCH = 16, 8, 32, 2


class HandNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm as written: an explicit upcast, and a cast back to the input's dtype."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(DIM))

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * x.to(dtype)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.hand = nn.RMSNorm(DIM), HandNorm()
        self.qkv, self.proj, self.up = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)

    def forward(self, x, cos):
        q, k, v = self.qkv(self.norm(x)).view(BATCH, SEQ, 3, 2, DIM // 2).transpose(1, 3).unbind(2)
        q = q * cos  # an fp32 rotary table: promotes a bf16 q to fp32
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2))
        scores = F.softmax(self.up(self.hand(x)), dim=-1)
        return x + scores


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.blocks, self.head = (
            nn.Embedding(VOCAB, DIM),
            nn.ModuleList([Block(), Block()]),
            nn.Linear(DIM, VOCAB),
        )
        self.register_buffer("freq", torch.linspace(0.1, 1.0, DIM // 2))

    def forward(self, tokens):
        cos = torch.outer(torch.arange(tokens.shape[1], device=tokens.device).float(), self.freq).cos()
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos)
        return self.head(x)


def _tokens():
    return torch.randint(0, VOCAB, (BATCH, SEQ))


@pytest.fixture(scope="module")
def graph():
    def loss(out, target):
        return F.cross_entropy(out.flatten(0, 1), target.flatten())

    return trace(Tiny(), (_tokens(),), loss_fn=loss, target=_tokens())


def _run_dtypes_of_fx(*, cast_params: bool) -> dict[str, str]:
    """Each fx node's output dtype when the model's graph runs under the executor's policy
    (execute/precision.py): bf16 autocast, with the weights cast to bf16 first under cast_params."""
    model = copy.deepcopy(Tiny())
    if cast_params:
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)
    gm = torch.fx.symbolic_trace(model)
    seen: dict[str, str] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if isinstance(out, torch.Tensor) and out.is_floating_point():
                seen[n.name] = str(out.dtype).removeprefix("torch.")
            return out

    with torch.autocast("cpu", dtype=torch.bfloat16):
        Recorder(gm).run(_tokens())
    return seen


@pytest.mark.parametrize("cast_params", [False, True])
def test_propagated_dtypes_are_those_autocast_runs(graph, cast_params):
    """Every floating node of the traced graph gets the dtype its fx node has when run under autocast
    on CPU: residual adds of fp32 and bf16 stay fp32, linears and attention are bf16, the explicit
    ``.float()`` is fp32 and ``.to(dtype)`` follows the input it read the dtype from."""
    policy = DtypePolicy(low="bfloat16", cast_params=cast_params, device="cpu")
    dtypes, measured = run_dtypes(graph, policy), _run_dtypes_of_fx(cast_params=cast_params)
    compared = [n for n in graph.nodes if n.name in measured and n.op != "input"]
    assert len(compared) > 30
    wrong = {n.name: (dtypes.dtype(n), measured[n.name]) for n in compared if dtypes.dtype(n) != measured[n.name]}
    assert not wrong, wrong


def test_the_residual_is_fp32_under_autocast_and_bf16_when_weights_are_cast(graph):
    autocast = run_dtypes(graph, DtypePolicy(low="bfloat16", cast_params=False, device="cpu"))
    cast = run_dtypes(graph, DtypePolicy(low="bfloat16", cast_params=True, device="cpu"))
    residual = [n for n in graph.nodes if n.target == "add" and n.layer and n.module == n.layer]
    linears = [n for n in graph.nodes if n.op == "linear"]
    floats = [n for n in graph.nodes if n.attrs.get("cast_dtype") == "float32" and n.layer]
    assert residual and all(autocast.dtype(n) == "float32" and cast.dtype(n) == "bfloat16" for n in residual)
    assert all(autocast.dtype(n) == cast.dtype(n) == "bfloat16" for n in linears)
    assert floats and all(autocast.dtype(n) == cast.dtype(n) == "float32" for n in floats)
    assert autocast.scale(residual[0]) == 1.0 and cast.scale(residual[0]) == 0.5


def test_cuda_autocast_runs_its_fp32_list_in_fp32(graph):
    """On CUDA, rms_norm and softmax are on autocast's fp32 list (AT_FORALL_FP32, aten/src/ATen/autocast_mode.h):
    fp32 even when the weights are bf16; on CPU neither is, so both keep their input's dtype."""
    cuda = run_dtypes(graph, DtypePolicy(low="bfloat16", cast_params=True, device="cuda"))
    cpu = run_dtypes(graph, DtypePolicy(low="bfloat16", cast_params=True, device="cpu"))
    for node in [n for n in graph.nodes if n.target in ("RMSNorm", "softmax")]:
        assert (cuda.dtype(node), cpu.dtype(node)) == ("float32", "bfloat16"), node.name


def test_the_priced_policy_is_the_executors():
    """cost/compute/dtypes.py states the executor's rule (execute/precision.py policy_for over
    data_parallel.dp_mode) without importing it: weights cast exactly where the executor casts them."""
    checked = 0
    for precision, zero, dp, cp in itertools.product(["fp32", "bf16", "fp16", "fp8"], [0, 1, 2, 3], [1, 2], [1, 2]):
        plan = Plan(devices=dp * cp, dp=dp, cp=cp, tp=1, pp=1, micro_batch_size=1, num_microbatches=1,
                    zero_stage=zero, precision=precision)  # fmt: skip
        priced = dtype_policy(plan, backend="gloo")
        runs = policy_for(precision=precision, dp_mode=dp_mode(plan=plan))
        assert (priced is None) == (precision == "fp32")
        assert priced is None or priced.cast_params == runs.cast_params, plan
        checked += priced is not None and priced.cast_params
    assert checked == 3 * 2 * 3  # low precision, ZeRO-2/3, dp * cp > 1


def test_pipeline_sends_the_residual_in_its_run_dtype(graph):
    """A bf16 pipeline sends its fp32 residual stream at 4 bytes an element under autocast (ZeRO-0), as
    an fp32 plan does, and at 2 under FSDP2's cast weights (ZeRO-2); Megatron's bf16 residual at 2."""
    model = CostModel(graph, synthetic_profile())

    def sent(dp=1, **kw):
        plan = Plan(devices=2 * dp, dp=dp, tp=1, pp=2, micro_batch_size=1, num_microbatches=2, **kw)
        return model.chunk_inputs(plan)[1].sent

    fp32, autocast = sent(precision="fp32"), sent(precision="bf16")
    cast, megatron = sent(precision="bf16", dp=2, zero_stage=2), sent(precision="bf16", runtime="megatron")
    assert autocast == fp32
    assert max(cast) == max(megatron) == pytest.approx(max(fp32) / 2)


def test_a_linear_keeps_its_own_bf16_copy_of_an_fp32_norm_output(graph):
    """Under autocast the norm's output is fp32, but the qkv linear that reads it casts it and saves the
    bf16 copy (autograd keeps the cast input of F.linear): its output is priced at 2 bytes an element
    in the saved bytes, the norm's own statistics at 4; with weights cast everything of it is bf16."""
    norm = next(n for n in graph.nodes if n.target == "RMSNorm")
    assert 0 < norm.output_bytes <= norm.saved_bytes
    for cast_params, expected in ((False, norm.saved_bytes - norm.output_bytes / 2), (True, norm.saved_bytes / 2)):
        dtypes = run_dtypes(graph, DtypePolicy(low="bfloat16", cast_params=cast_params, device="cpu"))
        assert saved_activation_bytes(norm, precision="bf16", gpu=False, dtypes=dtypes) == expected


class _Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn, self.head = nn.LSTM(16, 16, batch_first=True), nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


def test_an_lstm_runs_in_the_low_dtype_where_autocast_gives_it_a_kernel():
    """cuDNN's and oneDNN's RNNs run in autocast's low dtype: a bf16 LSTM's pipeline boundary was priced at fp32's
    bytes (the audit measured half). A CPU whose oneDNN has no bf16 kernel runs torch's native RNN in fp32, as
    execute/precision.py makes it; the run's own autocast is the check."""
    graph = trace(_Recurrent(), (torch.randn(2, 8, 16),))
    lstm = next(n for n in graph.nodes if n.attrs.get("module_type") == "LSTM")
    assert run_dtypes(graph, DtypePolicy(low="bfloat16", cast_params=False, device="cuda")).dtype(lstm) == "bfloat16"
    cpu = run_dtypes(graph, DtypePolicy(low="bfloat16", cast_params=False, device="cpu")).dtype(lstm)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ran = str(nn.LSTM(16, 16, batch_first=True)(torch.randn(2, 8, 16))[0].dtype).replace("torch.", "")
    except RuntimeError:  # oneDNN without this CPU's bf16 kernel: autoplan runs the native RNN, in fp32
        ran = "float32"
    assert cpu == ran
