"""A :class:`~autoplan.jobs.nodejob.NodeJob` for the cloud: a SkyPilot task, and a TorchX component for Kubernetes.

SkyPilot (``sky launch FILE``) provisions ``num_nodes`` nodes with ``accelerators: "NAME:G"``,
syncs the working folder (``workdir: .``, so the model and plan paths are relative to it), runs
``setup`` once per node and ``run`` on every node at once with its own environment:
``SKYPILOT_NODE_RANK`` (0 on the head), ``SKYPILOT_NODE_IPS`` (one IP a line, the head first),
``SKYPILOT_NUM_NODES`` and ``SKYPILOT_NUM_GPUS_PER_NODE``. The ``run`` script starts one torchrun
per node with a static rendezvous at the head's IP (``--node-rank``, ``--master-addr``), as
SkyPilot's distributed-training guide does. ``setup`` installs this checkout (autoplan/jobs/install.py),
copied to the nodes by ``file_mounts`` when it lies outside the workdir; ``envs`` holds the model's
size variables (``NodeJob.environment``).

Kubernetes: a TorchX component file (``torchx run --scheduler kubernetes FILE:train``), built on
TorchX's own ``dist.ddp`` component, which runs ``nodes`` replicas of an image, each one torchrun
of ``gpus_per_node`` ranks in a c10d rendezvous at replica 0; TorchX renders it as a Volcano job
(or for Slurm, AWS Batch, local processes with another ``--scheduler``). The image holds autoplan,
the model and the plan at the paths the component names; ``max_retries`` restarts the whole
job, which resumes from the checkpoint folder only if that outlives the replicas: a volume every
replica mounts at :data:`TORCHX_CHECKPOINTS` (a PersistentVolumeClaim on Kubernetes, or a host
path, TorchX's ``type=volume`` and ``type=bind`` mounts). Without one, retries would start from
step 0, so :func:`torchx_component` refuses ``max_retries > 0`` without a volume.
"""

from __future__ import annotations

import json
import re

from autoplan.errors import RunError
from autoplan.jobs.install import NodeInstall
from autoplan.jobs.nodejob import NodeJob

#: A shell line continuation and the indent of an argument of the per-node command.
CONTINUATION = "\\\n    "
#: Where a TorchX job's replicas mount the checkpoint volume (the ranks' --checkpoint-dir).
TORCHX_CHECKPOINTS = "/checkpoints"

#: Cloud accelerator names (SkyPilot's ``sky show-gpus``), matched in a profile's device name in
#: this order (the first pattern found wins: "A100-SXM4-80GB" is an A100-80GB, not an A100).
ACCELERATORS = (
    (r"GB200", "GB200"),
    (r"B200", "B200"),
    (r"H200", "H200"),
    (r"H100", "H100"),
    (r"A100.*80\s*GB", "A100-80GB"),
    (r"A100", "A100"),
    (r"L40S", "L40S"),
    (r"L4\b", "L4"),
    (r"A10G", "A10G"),
    (r"V100", "V100"),
    (r"T4\b", "T4"),
)


def accelerator_name(device_name: str) -> str | None:
    """The cloud accelerator name of a profile's device (``"NVIDIA H100-SXM5-80GB"`` -> ``"H100"``), or None."""
    for pattern, name in ACCELERATORS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return name
    return None


def skypilot_task(job: NodeJob, *, install: NodeInstall, header: str = "") -> str:
    """The SkyPilot task YAML (module docstring); ``install`` says how a node installs autoplan."""
    resources = {"accelerators": f"{_accelerator(job)}:{job.gpus_per_node}"} if job.uses_gpus else {"cpus": "4+"}
    lines = [*(f"# {line}" for line in header.splitlines())]
    lines += [f"name: {job.name}", f"num_nodes: {job.nodes}", "resources:"]
    lines += [f"  {key}: {json.dumps(value)}" for key, value in resources.items()]
    lines += ["workdir: .", *_mapping("file_mounts", install.file_mounts), *_mapping("envs", dict(job.environment))]
    lines += ["setup: |", *_indent(install.setup.strip().splitlines()), "run: |", *_indent(_run(job))]
    return "\n".join(lines) + "\n"


def _mapping(key: str, values: dict[str, str]) -> list[str]:
    """A YAML mapping of strings (JSON strings are YAML strings), or nothing when empty."""
    return (
        [f"{key}:", *(f"  {json.dumps(name)}: {json.dumps(value)}" for name, value in values.items())] if values else []
    )


def _accelerator(job: NodeJob) -> str:
    if not job.accelerator:
        raise RunError("SkyPilot needs the GPU's name and the plan's profile names none it knows; pass --accelerator.")
    return job.accelerator


def _run(job: NodeJob) -> list[str]:
    nproc = '"$SKYPILOT_NUM_GPUS_PER_NODE"' if job.uses_gpus else str(job.gpus_per_node)
    script = [
        "# the head node (rank 0) hosts the rendezvous; SKYPILOT_NODE_IPS lists it first",
        'HEAD=$(echo "$SKYPILOT_NODE_IPS" | head -n 1)',
        'torchrun --nnodes="$SKYPILOT_NUM_NODES" --node-rank="$SKYPILOT_NODE_RANK" \\',
        f'  --nproc-per-node={nproc} --master-addr="$HEAD" --master-port={job.rdzv_port} \\',
        f"  {job.executor_command(break_before_flags=CONTINUATION)}",
    ]
    return "\n".join(script).splitlines()  # one YAML block line per shell line


def _indent(lines: list[str]) -> list[str]:
    return [f"  {line}" if line else "" for line in lines]


def torchx_component(
    job: NodeJob,
    *,
    image: str,
    cpus_per_node: int,
    memory_mb_per_node: int,
    max_retries: int,
    checkpoint_volume: str | None,
) -> str:
    """A TorchX component file whose ``train`` function returns the job as an ``AppDef`` (module
    docstring); ``checkpoint_volume`` is a volume claim name or an absolute host path, mounted at
    :data:`TORCHX_CHECKPOINTS` in every replica."""
    if max_retries < 0:
        raise RunError(f"--max-retries {max_retries}: expected 0 or more whole-job restarts.")
    if max_retries and not checkpoint_volume:
        raise RunError(
            f"TorchX's {max_retries} restart(s) resume only from checkpoints every replica can read; pass "
            "--checkpoint-volume with a shared PersistentVolumeClaim (or an absolute host path), or --max-retries 0."
        )
    call_args = ",\n        ".join(json.dumps(arg) for arg in job.executor_args)
    return _COMPONENT.format(
        nodes=job.nodes,
        gpus_per_node=job.gpus_per_node,
        image=json.dumps(image),
        cpus=cpus_per_node,
        memory_mb=memory_mb_per_node,
        max_retries=max_retries,
        volume=json.dumps(checkpoint_volume or ""),
        checkpoints=json.dumps(TORCHX_CHECKPOINTS),
        call_args=call_args,
        name=json.dumps(job.name),
        env=json.dumps(dict(job.environment)),
        gpu=job.gpus_per_node if job.uses_gpus else 0,
        rdzv_port=job.rdzv_port,
    )


_COMPONENT = '''"""TorchX component: autoplan's executor on {nodes} node(s) x {gpus_per_node} rank(s).

Run on Kubernetes (a Volcano queue) with:
    torchx run --scheduler kubernetes --scheduler_args queue=default THIS_FILE:train --image IMAGE
Written by `autoplan launch --torchx` (docs/launch.md).
"""

import torchx.specs as specs
from torchx.components import dist


def train(
    image: str = {image},
    cpu: int = {cpus},
    memMB: int = {memory_mb},
    max_retries: int = {max_retries},
    checkpoint_volume: str = {volume},
) -> specs.AppDef:
    """autoplan's ranks under one torchrun per replica, in a c10d rendezvous at replica 0.

    Args:
        image: container image with autoplan, the model and the plan
        cpu: CPU cores per node
        memMB: memory per node in MB
        max_retries: whole-job restarts; each resumes from the newest checkpoint in the volume
        checkpoint_volume: PersistentVolumeClaim (or absolute host path) every replica mounts for checkpoints
    """
    if max_retries and not checkpoint_volume:
        raise ValueError("max_retries > 0 resumes only from a shared checkpoint volume: pass --checkpoint_volume")
    mounts = None
    if checkpoint_volume:
        kind = "bind" if checkpoint_volume.startswith("/") else "volume"
        mounts = [f"type={{kind}}", f"src={{checkpoint_volume}}", "dst=" + {checkpoints}]  # specs.parse_mounts
    return dist.ddp(
        {call_args},
        m="autoplan.cli",
        name={name},
        image=image,
        j="{nodes}x{gpus_per_node}",
        cpu=cpu,
        gpu={gpu},
        memMB=memMB,
        env={env},
        rdzv_port={rdzv_port},
        max_retries=max_retries,
        mounts=mounts,
    )
'''
