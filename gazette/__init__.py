"""The `gazette` command, above both runtimes: `gazette serve` runs a broker (`broker.cli`),
`gazette consume MODULE:ATTR` a consumer application (`consumer.cli`). `cli` builds the command;
`python -m gazette` runs it, as the `gazette` console script does."""
