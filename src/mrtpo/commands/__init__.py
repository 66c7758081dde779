"""One module per `mrtpo` subcommand, each with `main(argv: list[str]) -> int`."""
