// Gathers and scatters by an index tensor: embedding, index_select, indexing by index tensors, gather,
// and (MODE scatter) scatter and index_put, or (MODE combine) scatter_add, scatter_reduce and
// index_put with accumulate. One thread per element of the iteration space; for each of its dims the
// params give the step it makes in the source (or destination) and in the index tensor, and one more
// stride multiplies the index value read. Negative indices count from the end; an index outside
// [-bound, bound) reads zero and raises the region's error flag, so the host reports it.
//
// MODE combine folds each value into its destination with COMBINE(old, value) in a compare-and-swap
// loop on the destination's bits, so threads that meet on one element all land (in some order).

{{MATH}}

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<{{OUT_ELEMENT}}>;
@group(0) @binding(2) var<storage, read> src: array<{{TYPE}}>;
@group(0) @binding(3) var<storage, read> index: array<i32>;
@group(0) @binding(4) var<storage, read_write> error_flag: array<atomic<u32>>;

const RANK: u32 = {{RANK}}u;
const GATHER: u32 = 0u;
const SCATTER: u32 = 1u;
const COMBINE: u32 = 2u;
const MODE: u32 = {{MODE}}u;

// params: [count, bound, gather_stride, src_offset, index_offset, out_offset,
//          shape[RANK], src_steps[RANK], index_steps[RANK], out_steps[RANK]]

fn combine(a: {{TYPE}}, b: {{TYPE}}) -> {{TYPE}} {
    return {{COMBINE}};
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * 256u;
    if (i >= params[0]) {
        return;
    }
    var rest = i;
    var s = params[3];
    var k = params[4];
    var o = params[5];
    for (var d = RANK; d > 0u; d--) {
        let size = params[6u + d - 1u];
        let c = rest % size;
        rest /= size;
        s += c * params[6u + RANK + d - 1u];
        k += c * params[6u + 2u * RANK + d - 1u];
        o += c * params[6u + 3u * RANK + d - 1u];
    }
    let bound = i32(params[1]);
    var at = index[k];
    if (at < 0) {
        at += bound;
    }
    if (at < 0 || at >= bound) {
        atomicStore(&error_flag[0], 1u);
        if (MODE == GATHER) {
            {{GATHER_ZERO}}
        }
        return;
    }
    let moved = u32(at) * params[2];
    {{BODY}}
}
