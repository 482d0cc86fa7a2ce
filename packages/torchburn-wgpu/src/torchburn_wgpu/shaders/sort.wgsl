// Sorts each line of a contiguous tensor seen as [outer, n, inner] (a line: the n elements of one
// (outer, inner) pair, `inner` apart), with the positions the values came from. One workgroup per
// line: the line is loaded into workgroup memory, padded to SIZE (a power of two), and put in order
// by a bitonic network. Keys compare with their positions as the tie-break, so the order is total:
// equal values keep their order (a stable sort), NaN goes last ascending and first descending, as
// PyTorch orders them.
//
// params: [lines, n, inner, descending]

{{MATH}}

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> values: array<{{TYPE}}>;
@group(0) @binding(2) var<storage, read_write> positions: array<i32>;
@group(0) @binding(3) var<storage, read> x: array<{{TYPE}}>;

const SIZE: u32 = {{SIZE}}u;
const WG: u32 = 256u;

var<workgroup> keys: array<{{TYPE}}, SIZE>;
var<workgroup> at: array<u32, SIZE>;

fn is_nan(v: {{TYPE}}) -> bool {
    return {{IS_NAN}};
}

// whether element (a, ia) belongs before (b, ib); padding (a position >= n) goes after everything
fn before(a: {{TYPE}}, ia: u32, b: {{TYPE}}, ib: u32, n: u32, descending: bool) -> bool {
    if (ia >= n || ib >= n) {
        return ib >= n && ia < ib;
    }
    let a_nan = is_nan(a);
    let b_nan = is_nan(b);
    if (a_nan || b_nan) {
        if (a_nan && b_nan) {
            return ia < ib;
        }
        return select(b_nan, a_nan, descending);
    }
    if (a == b) {
        return ia < ib;
    }
    return select((a < b), (a > b), descending);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let line = wg.x + wg.y * groups.x;
    if (line >= params[0]) {
        return;
    }
    let n = params[1];
    let inner = params[2];
    let descending = params[3] != 0u;
    let base = (line / inner) * n * inner + line % inner;
    for (var i = lid; i < SIZE; i += WG) {
        if (i < n) {
            keys[i] = x[base + i * inner];
        }
        at[i] = i;
    }
    workgroupBarrier();
    for (var k = 2u; k <= SIZE; k <<= 1u) {
        for (var j = k >> 1u; j > 0u; j >>= 1u) {
            for (var i = lid; i < SIZE; i += WG) {
                let l = i ^ j;
                if (l > i) {
                    let up = (i & k) == 0u;
                    // in an ascending block the pair is out of order when l's element belongs first
                    let swap = select(before(keys[i], at[i], keys[l], at[l], n, descending),
                                      before(keys[l], at[l], keys[i], at[i], n, descending), up);
                    if (swap) {
                        let key = keys[i];
                        keys[i] = keys[l];
                        keys[l] = key;
                        let moved_at = at[i];
                        at[i] = at[l];
                        at[l] = moved_at;
                    }
                }
            }
            workgroupBarrier();
        }
    }
    for (var i = lid; i < n; i += WG) {
        values[base + i * inner] = keys[i];
        positions[base + i * inner] = i32(at[i]);
    }
}
