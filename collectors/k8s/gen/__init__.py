"""Generated from podresources_v1.proto by `python -m collectors.k8s.regen_podresources`. Do not edit."""
