"""What comes in: the one reader per user file (`formats`), assistants' data exports (`exports`), the one way
a batch of conversations enters the store (`intake`), and the research data sets' loaders (`wassa`,
`convabuse`)."""
