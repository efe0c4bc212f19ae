"""What every Lightning run shares: the entry-point preamble and config composition (app), devices and batch
arithmetic, optimizers, strategies, loggers, checkpoint IO, the one weight loader, curves and callbacks."""
