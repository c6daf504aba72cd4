"""Hierarchical (Blue Connect style) AllReduce: a port of MSCCLang's `hierarchical_allreduce`
(Azure/msccl-tools, `examples/mscclang/hierarchical_allreduce.py`, its default `auto`
schedule; its output is `allreduce_hierarchical_n2g4_i1_simple.xml` and
`allreduce_hierarchical_n2g8_i1_simple.xml` in the shared MSCCL corpus).

`nodes` nodes of `gpus` GPUs, one chunk per rank. Chunk k = g*nodes + h is finished by local
rank g of node h: a reduce-scatter ring inside every node brings the node's partial sum of k
to local rank g, a ring over the nodes (through local rank g of each) completes it on node h,
and two all-gather rings, across the nodes and then inside them, hand it back to everyone.

The original leaves channels to msccl-tools, which gives every forwarding path its own;
they are written out here as it chose them for 2 nodes: a reduce-scatter path of chunk k
runs on channel k, an all-gather path that crosses nodes on channel ranks + g, and the
all-gather inside node h on the channel of the reduce-scatter path that it retraces.
"""

from hccl import Algorithm, Buffer


def hierarchical_allreduce(gpus=4, nodes=2):
    n = gpus * nodes
    a = Algorithm("allreduce", ranks=n, chunks=n, in_place=True, name="hierarchical_allreduce")

    def ring(k, path, ch, reduce):  # moves chunk k hop by hop along the ranks in `path`
        for src, dst in zip(path, path[1:]):
            c = a.chunk(src, Buffer.input, k)
            if reduce:
                a.chunk(dst, Buffer.input, k).reduce(c, ch=ch)
            else:
                c.copy(dst, ch=ch)

    def inside(node, g):  # the ring through a node's GPUs, from its local rank g
        return [node * gpus + (g + s) % gpus for s in range(gpus)]

    def across(node, g):  # the ring through local rank g of every node, from `node`
        return [(node + s) % nodes * gpus + g for s in range(nodes)]

    # Reduce-scatter inside every node: chunk k ends on local rank g = k // nodes.
    for node in range(nodes):
        for k in range(n):
            ring(k, inside(node, k // nodes + 1), k, reduce=True)
    # Reduce-scatter across the nodes, through local rank g: chunk k ends on node h = k % nodes.
    for k in range(n):
        ring(k, across(k % nodes + 1, k // nodes), k, reduce=True)
    # All-gather across the nodes from node h, then inside every node from local rank g.
    for k in range(n):
        ring(k, across(k % nodes, k // nodes), n + k // nodes, reduce=False)
    for node in range(nodes):
        for k in range(n):
            ch = (k - nodes) % n if node == k % nodes else n + k // nodes
            ring(k, inside(node, k // nodes), ch, reduce=False)
    return a
