"""Data and store: conversations, the user-file readers (one per file), the rating dataset, the store,
synthetic studies and the WASSA 2024 adapter. Knows nothing of Label Studio."""
