"""The worker container as the synthesized template defines it: read, never retyped."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# What Docker (and so Fargate) grants a container before Drop and Add (moby oci/caps/defaults.go).
DEFAULT_CAPABILITIES = frozenset(
    {
        "CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID",
        "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE",
    }
)  # fmt: skip
# The only capability a Fargate task definition may add.
FARGATE_ADDABLE = frozenset({"SYS_PTRACE"})
CONTAINER = "worker"


@dataclass(frozen=True)
class Container:
    name: str
    environment: dict[str, Any]  # values may be intrinsics (Ref, Fn::GetAtt, ...)
    drop: frozenset[str]
    add: frozenset[str]
    user: str | None
    readonly_root: bool
    init_process: bool
    mount_points: list[dict[str, Any]]
    volumes: list[dict[str, Any]]
    stop_timeout_s: int | None

    @property
    def capabilities(self) -> frozenset[str]:
        """The bounding set the container gets: Docker's defaults, minus Drop, plus Add."""
        kept = frozenset() if "ALL" in self.drop else DEFAULT_CAPABILITIES - self.drop
        return kept | (DEFAULT_CAPABILITIES if "ALL" in self.add else self.add)


def task_definitions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        logical: resource["Properties"]
        for logical, resource in template["Resources"].items()
        if resource["Type"] == "AWS::ECS::TaskDefinition"
    }


def worker_container(template: dict[str, Any]) -> Container:
    found = [
        (props, container)
        for props in task_definitions(template).values()
        for container in props.get("ContainerDefinitions", [])
        if container.get("Name") == CONTAINER
    ]
    if len(found) != 1:
        raise LookupError(
            f"expected one AWS::ECS::TaskDefinition container named {CONTAINER!r}, "
            f"found {len(found)}"
        )
    props, container = found[0]
    linux = container.get("LinuxParameters", {})
    caps = linux.get("Capabilities", {})
    return Container(
        name=container["Name"],
        environment={e["Name"]: e["Value"] for e in container.get("Environment", [])},
        drop=frozenset(caps.get("Drop", [])),
        add=frozenset(caps.get("Add", [])),
        user=container.get("User"),
        readonly_root=bool(container.get("ReadonlyRootFilesystem", False)),
        init_process=bool(linux.get("InitProcessEnabled", False)),
        mount_points=list(container.get("MountPoints", [])),
        volumes=list(props.get("Volumes", [])),
        stop_timeout_s=container.get("StopTimeout"),
    )
