"""Where a run's checkpoints are and which of them is complete (plain file checks, no torch), how they are written so
that a kill cannot leave a half file under a real name (Lightning's and DeepSpeed's), which are kept, and the one
weight loader that turns any checkpoint a user names into an encoder's weights. Imports no other room."""
