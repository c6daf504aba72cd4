"""Two-step AllToAll: a port of MSCCLang's `alltoall_hierarchical` (Azure/msccl-tools,
`examples/mscclang/alltoall_a100_two_step.py`; its output is `alltoall_two_step_n2g8_simple.xml`
in the shared MSCCL corpus).

`nodes` nodes of `gpus` GPUs, one chunk per rank pair. Chunks for another node cross the
network once per pair of GPUs with the same local rank: first, inside the sending node, GPU g
gathers in its scratch every chunk that its node sends to GPU g of the remote node; then it
sends them there in one transfer of `gpus` chunks, on a channel per node pair and GPU parity.
Chunks for the rank's own node go directly.
"""

from hccl import Algorithm, Buffer


def alltoall_two_step(nodes=2, gpus=8):
    n = nodes * gpus
    a = Algorithm("alltoall", ranks=n, chunks=n, in_place=False, name="hierarchical_all_to_all")
    for n1 in range(nodes):
        for r in range(1, nodes):  # gather: rank n1:g1's chunk for n2:g2 goes to scratch of n1:g2
            n2 = (n1 + r) % nodes
            for g1 in range(gpus):
                for g2 in range(gpus):
                    c = a.chunk(n1 * gpus + g1, Buffer.input, n2 * gpus + g2)
                    c.copy(n1 * gpus + g2, Buffer.scratch, (r - 1) * gpus + g1)
        for r in range(1, nodes):  # one network transfer per remote node
            n2 = (n1 + r) % nodes
            for g in range(gpus):
                rank = n1 * gpus + g
                c = a.chunk(rank, Buffer.scratch, (r - 1) * gpus, count=gpus)
                ch = (n1 + n2) % gpus * 2 + rank % 2 + 2  # the original's channel formula
                c.copy(n2 * gpus + g, Buffer.output, n1 * gpus, ch=ch)
    for rank in range(n):  # chunks within the node
        node = rank // gpus
        for g in range(gpus):
            a.chunk(rank, Buffer.input, node * gpus + g).copy(node * gpus + g, Buffer.output, rank)
    return a
