"""The k8s collector against a fake kubelet: a real gRPC server on a unix socket in a temp dir,
serving v1.PodResourcesLister/List from the same proto the kubelet is built from."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from perfd.collectors.collector import Registry  # noqa: E402
from perfd.collectors.k8s import K8sCollector, K8sConfig, gpu_owners  # noqa: E402
from perfd.collectors.k8s.gen import podresources_v1_pb2 as pb  # noqa: E402
from perfd.collectors.k8s.gen import podresources_v1_pb2_grpc as pb_grpc  # noqa: E402

ROOT = Path(__file__).resolve().parents[4]
UUID0 = "GPU-1d6a1b9e-3f4c-11ef-9a2b-0242ac120002"
UUID1 = "GPU-7c2e4f10-3f4c-11ef-9a2b-0242ac120002"
MIG = "MIG-0a1b2c3d-0000-1111-2222-333344445555"


def _response(pods: list[tuple[str, str, list[tuple[str, str, list[str]]]]]) -> Any:
    out = pb.ListPodResourcesResponse()
    for ns, name, containers in pods:
        pod = out.pod_resources.add(name=name, namespace=ns)
        for cname, resource, ids in containers:
            c = pod.containers.add(name=cname)
            if ids:
                c.devices.add(resource_name=resource, device_ids=ids)
    return out


class FakeKubelet(pb_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.response = _response([])
        self.calls = 0
        self.hold = threading.Event()  # cleared: List answers only once it is set again
        self.hold.set()

    def List(self, request: Any, context: Any) -> Any:  # the proto's name
        self.calls += 1
        self.hold.wait(60)
        return self.response


@pytest.fixture
def kubelet() -> Iterator[tuple[FakeKubelet, str]]:
    # A short path: unix socket names are limited to 107 bytes.
    d = tempfile.mkdtemp(prefix="perfd-kubelet-", dir="/tmp")
    sock = f"{d}/kubelet.sock"
    fake = FakeKubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(fake, server)
    assert server.add_insecure_port(f"unix://{sock}") == 1
    server.start()
    try:
        yield fake, sock
    finally:
        server.stop(grace=None).wait(5)
        shutil.rmtree(d, ignore_errors=True)


def test_maps_gpu_uuids_to_pods(kubelet):
    fake, sock = kubelet
    fake.response = _response([
        ("ml", "train-0", [("trainer", "nvidia.com/gpu", [UUID1, UUID0]),
                           ("perfd-agent", "nvidia.com/gpu", [])]),
        ("ml", "other", [("app", "example.com/fpga", ["fpga-0"])]),  # not a GPU: left out
        ("serve", "llm-1", [("sglang", "nvidia.com/mig-1g.10gb", [MIG]),
                            ("side", "nvidia.com/gpu", ["3"])]),  # index strategy
    ])
    col = K8sCollector({"socket": sock, "job": "ignored"})
    assert col.probe().available
    out = col.collect(100.0)
    assert fake.calls == 1 and not col.errors and not out.samples
    (ev,) = out.events
    assert ev["kind"] == "gpu_pods" and ev["text"] == "4 GPU(s) allocated to 2 pod(s)"
    by_device = {p["device"]: p for p in ev["payload"]}
    assert by_device[UUID0] == {"device": UUID0, "uuid": UUID0, "namespace": "ml", "pod": "train-0",
                                "container": "trainer", "resource": "nvidia.com/gpu"}
    assert by_device[UUID1]["pod"] == "train-0"
    assert by_device[MIG]["container"] == "sglang"
    assert by_device["3"]["gpu"] == "3" and "uuid" not in by_device["3"]
    assert "fpga-0" not in by_device

    # Unchanged: no new event until event_interval_s; a change: at once.
    assert col.collect(110.0).events == []
    assert len(col.collect(161.0).events) == 1
    fake.response = _response([("ml", "train-1", [("trainer", "nvidia.com/gpu", [UUID0])])])
    (ev,) = col.collect(162.0).events
    assert [(p["pod"], p["uuid"]) for p in ev["payload"]] == [("train-1", UUID0)]
    col.stop()


def test_dynamic_resource_allocation_devices(kubelet):
    fake, sock = kubelet
    resp = pb.ListPodResourcesResponse()
    pod = resp.pod_resources.add(name="dra-pod", namespace="ml")
    c = pod.containers.add(name="trainer")
    claim = c.dynamic_resources.add(claim_name="gpu-claim", claim_namespace="ml")
    claim.claim_resources.add(driver_name="gpu.nvidia.com", pool_name="node-1", device_name="gpu-0",
                              cdi_devices=[pb.CDIDevice(name=f"k8s.gpu.nvidia.com/device={UUID0}")])
    fake.response = resp
    owners = gpu_owners(K8sCollector({"socket": sock}).client.list())
    assert {(o.device, o.pod, o.resource) for o in owners} == {
        ("gpu-0", "dra-pod", "gpu.nvidia.com"), (UUID0, "dra-pod", "gpu.nvidia.com")}


def test_kubelet_gone_or_slow_is_counted_not_raised(kubelet):
    fake, sock = kubelet
    col = K8sCollector({"socket": sock, "timeout_s": 0.2})
    fake.hold.clear()  # the kubelet answers nothing until released: only the client's timeout ends it
    t0 = time.monotonic()
    assert col.collect(1.0).events == []
    assert time.monotonic() - t0 < 30 and col.errors == {"list-failed": 1}
    fake.hold.set()
    assert len(col.collect(2.0).events) == 1  # reconnects after a failure


def test_no_socket_is_unavailable_with_the_reason(tmp_path: Path):
    col = K8sCollector({"socket": str(tmp_path / "missing.sock")})
    caps = col.probe()
    assert not caps.available and "pod-resources" in caps.reason
    assert col.collect(1.0).events == [] and not col.errors


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="interval_s"):
        K8sConfig.from_dict({"interval_s": 0})
    with pytest.raises(ValueError, match="unknown"):
        K8sConfig.from_dict({"sokcet": "/x"})
    with pytest.raises(ValueError, match="resources"):
        K8sConfig.from_dict({"resources": "nvidia.com/"})
    reg = Registry()
    import perfd.collectors.k8s

    perfd.collectors.k8s.register(reg)
    assert isinstance(reg.create("k8s", {"socket": "/nope"}), K8sCollector)


def test_sample_config_is_valid():
    import yaml

    K8sConfig.from_dict(yaml.safe_load((ROOT / "perfd" / "collectors" / "k8s" / "sample.yaml").read_text()))


def test_generated_code_is_not_stale():
    pytest.importorskip("grpc_tools")
    from perfd.collectors.k8s.regen_podresources import GEN_DIR, stale_files

    assert not stale_files(GEN_DIR), \
        "run `python -m perfd.collectors.k8s.regen_podresources` and commit the result"


def test_generated_code_imports_with_installed_protobuf():
    # The generated modules check the protobuf runtime's version at their import. An import that raised
    # leaves no module behind, so importing here runs the check again where it failed before: this
    # import succeeds exactly when a fresh interpreter's would.
    from perfd.collectors.k8s.gen import podresources_v1_pb2 as gen_pb
    from perfd.collectors.k8s.gen import podresources_v1_pb2_grpc as gen_grpc

    assert gen_pb.DESCRIPTOR.services_by_name["PodResourcesLister"].full_name == "v1.PodResourcesLister"
    assert hasattr(gen_grpc, "PodResourcesListerStub")
