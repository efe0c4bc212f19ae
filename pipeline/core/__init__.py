"""What every Lightning run shares, in rooms named for the question each answers. The imports go one way, down this
list; every room may use devices.py and file_stamp.py, which import nothing of the pipeline.

    app.py        the entry-point preamble: known noise silenced, config composed, a refused start said once
    cluster/      who may write a run directory, and what happens when SLURM signals or a try fails
    run/          what a run is, where its metrics go, and whether a start or resume may continue it
    speed/        how a step runs on its devices and how fast: strategies, the micro-batch, FP8, host syncs
    checkpoints/  where checkpoints are, which is complete, and the one weight loader
    optim/        optimizers and learning-rate schedules (apart: nothing else here imports them)
    devices.py    how many processes a run has, and the batch arithmetic that follows
    file_stamp.py a file's identity without reading it (torch-free: the workflow's processes use it)
"""
