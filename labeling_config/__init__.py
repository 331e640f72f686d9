"""Data package: the taxonomy (taxonomy.yaml) and the Label Studio configs rendered from it."""
