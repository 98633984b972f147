"""The ``vfm`` command line: one module per subcommand."""
