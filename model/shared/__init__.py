"""What both encoders build on, knowing neither: their outputs and losses, dropout, the unpadded layout of a batch,
the decoder padded to a multiple of 64, and the reading of any transformers checkpoint directory."""
