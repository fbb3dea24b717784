"""The DP batch loop, written once, and what plugs into it (aggregators, privacy units, augmentation multiplicity)."""
