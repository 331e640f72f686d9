"""The domain types: conversations and their messages, rating data in memory with rater traits as numbers
(`dataset`), and model items built from them (`items`). Knows nothing of the store, of files or of Label
Studio."""
