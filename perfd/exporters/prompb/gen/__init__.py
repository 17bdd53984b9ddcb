"""Generated from remote.proto by `python -m perfd.exporters.prompb.regen_remote`. Do not edit."""
