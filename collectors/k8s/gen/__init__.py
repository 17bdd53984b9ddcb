"""Generated from podresources_v1.proto by `python -m collectors.k8s.regen`. Do not edit."""
