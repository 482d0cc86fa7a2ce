// Elementwise: each thread computes a few output elements, a launch's width apart. Each input is read through its own offset and strides
// (a broadcast is a zero stride and a view is just other strides, so neither needs a copy), and the
// body is a whole fused chain of elementwise ops, generated per region, with no intermediate in memory.
//
// params: [numel, shape[RANK], then per input: offset, strides[RANK]]

{{MATH}}
{{MATH64}}

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<{{OUT_TYPE}}>;
{{INPUTS}}

const RANK: u32 = {{RANK}}u;

fn offset_of(input: u32, linear: u32) -> u32 {
    let base = 1u + RANK + input * (RANK + 1u);
    var rest = linear;
    var off = params[base];
    for (var d = RANK; d > 0u; d--) {
        let size = params[d];
        off += (rest % size) * params[base + d];
        rest /= size;
    }
    return off;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let t = gid.x + gid.y * groups.x * 256u;
    if (t >= params[0]) {
        return;
    }
{{BODY}}
}
