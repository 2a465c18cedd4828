"""The node agent (`topology-webhook discover`): NVML facts -> NodeTopology -> the annotations and
labels placement reads, one module per step: `facts` (what is known of a node), `nvml` (reading it
through NVML), `derive` (what placement needs, pure), `publish` (onto the Node through the API),
`command` (the command line)."""
