"""Generated from perfd.proto by `python -m perfd.transport.regen`. Do not edit."""
