"""Kubernetes' own schemas, checked as kubernetes-validate checks a document, each schema read and
compiled once a process.

``kubernetes_validate.validate`` reads the version's definitions (1.1 MB of JSON) and the kind's
schema, and builds a new registry and validator, on every call: 20-100 ms a document and version,
and the deploy tests validate a few hundred. Here the same files, the same version choice and the
same Draft 2020-12 validator, kept per (schema folder, kind, API version): what each check decides
is kubernetes-validate's, only the reading is done once.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import jsonschema
import kubernetes_validate as kv
from kubernetes_validate import utils
from referencing import Registry, Resource


@functools.cache
def _versions() -> tuple[str, ...]:
    return tuple(utils.all_versions())


def latest_version() -> str:
    return _versions()[-1]


@functools.cache
def _definitions(schema_dir: str, desired: str) -> Resource[Any]:
    path = f"kubernetes-json-schema/{schema_dir}/_definitions.json"
    return Resource.from_contents(utils.schema_contents(path, desired))


@functools.cache
def _validator(schema_dir: str, kind: str, api_version: str, desired: str) -> jsonschema.Validator:
    schema = utils.schema_contents(f"kubernetes-json-schema/{schema_dir}/{kind}-{api_version}.json", desired)
    own: Registry[Any] = Resource.from_contents(schema) @ Registry()
    registry: Registry[Any] = _definitions(schema_dir, desired) @ own
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def validate(data: dict[str, Any], desired_version: str, strict: bool = True) -> str:
    """kubernetes_validate.validate: the Kubernetes version whose schema checked ``data``; raises its
    ValidationError (or SchemaNotFoundError) as it does."""
    desired = desired_version.removeprefix("v")
    if utils.major_minor(desired) > latest_version():
        raise kv.utils.VersionNotSupportedError(version=utils.major_minor(desired))
    # the latest schema version not newer than the one asked for
    version = [v for v in _versions() if utils.major_minor(v) <= utils.major_minor(desired)][-1]
    # rbac.authorization.k8s.io/v1 -> rbac-v1
    api_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", data["apiVersion"])
    schema_dir = f"v{version}-local" + ("-strict" if strict else "")
    try:
        validator = _validator(schema_dir, data["kind"].lower(), api_version, desired)
    except FileNotFoundError:
        raise kv.SchemaNotFoundError(version=utils.major_minor(desired), kind=data["kind"],
                                     api_version=data["apiVersion"]) from None
    try:
        validator.validate(data)
    except jsonschema.ValidationError as e:
        raise kv.ValidationError(e, version=utils.major_minor(version)) from None
    checked: str = utils.major_minor(version)
    return checked
