"""Generated from remote.proto by `python -m perfd.exporters.prompb.regen`. Do not edit."""
