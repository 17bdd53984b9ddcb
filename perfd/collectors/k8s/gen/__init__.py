"""Generated from podresources_v1.proto by `python -m perfd.collectors.k8s.regen_podresources`. Do not edit."""
