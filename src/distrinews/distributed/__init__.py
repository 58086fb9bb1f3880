"""Several processes as one job: the launcher (``--nproc-per-node``, ``--nnodes``, restarts), the process
group and its collectives, the rendezvous roll-call, the watchdog that names a silent rank, agreed
preemption on SIGTERM, the parallel strategies (ddp | fsdp | lora) and each process's share of the
machine. Importing this package imports none of them.
"""
