"""The ``vmctl`` command line."""
