"""Ring AllReduce: a port of MSCCLang's `allreduce_ring` (Azure/msccl-tools,
`examples/mscclang/allreduce_a100_ring.py`; its output is `allreduce_ring_r8_ch1_i1_ll128.xml`
and `allreduce_ring_r8_ch4_i2_simple.xml` in the shared MSCCL corpus).

Chunk k starts on rank k and goes once around the ring, every rank adding its own chunk k, so
that rank k-1 ends with the sum; the sum then goes around once more to the other ranks. The
chunks are dealt round-robin to `channels` channels. `instances` replicates the ring the way
msccl-tools does: instance i owns chunks k*instances + i and channels i*channels onwards.
"""

from hccl import Algorithm, Buffer


def ring_allreduce(ranks=8, channels=1, instances=1):
    name = f"allreduce_ring_{channels}channelsperring"
    a = Algorithm("allreduce", ranks=ranks, chunks=ranks * instances, in_place=True, name=name)
    for i in range(instances):

        def chunk(rank, k, i=i):
            return a.chunk(rank % ranks, Buffer.input, k * instances + i)

        def ch(k, i=i):
            return i * channels + k % channels

        # First hop, one side at a time: every rank must send its own chunk before it receives,
        # and `reduce`, which records both sides at once, cannot be ordered so for all ranks.
        for k in range(ranks):
            a.send(chunk(k, k), (k + 1) % ranks, ch=ch(k))
        for k in range(ranks):
            a.recv_reduce_copy(k, chunk(k + 1, k), chunk(k + 1, k), ch=ch(k))
        # Reduce-scatter: at each step, chunk k moves on from rank k+step to rank k+step+1.
        for step in range(1, ranks - 1):
            for k in range(ranks):
                chunk(k + step + 1, k).reduce(chunk(k + step, k), ch=ch(k))
        # All-gather: the sum of chunk k leaves rank k-1 and visits every other rank.
        for step in range(ranks - 1):
            for k in range(ranks):
                chunk(k + step - 1, k).copy((k + step) % ranks, ch=ch(k))
    return a
