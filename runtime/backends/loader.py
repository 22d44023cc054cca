"""Which backend opens a graph: the one place that knows every backend.

Adding a backend means a module beside this one that implements ``GraphSession`` (base.py) with
its own ``DeviceMemory``, and one branch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from specx.runtime.artifact.contract import Manifest, ModelSpec
from specx.runtime.backends.base import GraphSession
from specx.runtime.backends.ort_session import OrtSession
from specx.runtime.errors import ArtifactError


def open_graph(
    folder: Path,
    manifest: Manifest,
    spec: ModelSpec,
    providers: Sequence[str],
    threads: int | None = None,
    alternating: bool = False,
) -> GraphSession:
    """Load `spec`'s graph from the artifact `folder` for the chosen providers (see
    providers.choose_providers) and check that it belongs to this manifest's export."""
    session: GraphSession
    if providers[0] == "tensorrt":
        entry = next((e for e in manifest.engines if e["graph"] == spec.graph), None)
        if entry is None:
            raise ArtifactError(
                f"this artifact has no TensorRT engine for {spec.graph}",
                "build them (specx build ARTIFACT --profile NAME) or use --provider cuda/cpu",
            )
        from specx.runtime.backends.trt_session import TensorRTSession

        session = TensorRTSession(folder, spec, entry)
    else:
        session = OrtSession(folder / spec.graph, spec, providers, threads, alternating=alternating)
    expected = spec.pair_id or manifest.pair_id  # a draft taken from another artifact: its own
    if session.pair_id is not None and session.pair_id != expected:
        raise ArtifactError(
            f"{spec.graph} belongs to export {session.pair_id!r}, the manifest to "
            f"{expected!r}: graphs from different exports are mixed",
            "use the folder of one `specx export` run as it was written",
        )
    return session
