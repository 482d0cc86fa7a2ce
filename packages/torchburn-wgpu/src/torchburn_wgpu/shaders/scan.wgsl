// Cumulative scans along one dim (cumsum, cumprod, logcumsumexp, cummax, cummin) of a contiguous
// tensor seen as [outer, n, inner]: a line is the n elements of one (outer, inner) pair, `inner` apart.
//
// Long lines (LINE_PER_THREAD false): one workgroup per line. Each of its 256 threads folds a chunk
// of consecutive elements, a Hillis-Steele scan over the chunk totals in workgroup memory gives every
// chunk the fold of all before it, and each thread scans its chunk again from that prefix. Short lines
// (LINE_PER_THREAD true): each thread scans one whole line, 256 lines per workgroup.
//
// ARG mode (cummax/cummin) carries the position of the running extreme: a later element takes over
// when TAKES holds, which reproduces PyTorch's rule (ties and NaNs move the index to the later one).
//
// params: [lines, n, inner]

{{MATH}}

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<{{ACC}}>;
{{POSITIONS}}
@group(0) @binding({{X_BINDING}}) var<storage, read> x: array<{{IN_TYPE}}>;

const WG: u32 = 256u;
const LINE_PER_THREAD: bool = {{LINE_PER_THREAD}};
const ARG: bool = {{ARG}};
const NONE: u32 = 0xffffffffu;

var<workgroup> carry: array<{{ACC}}, 256>;
var<workgroup> carry_at: array<u32, 256>;

fn load(i: u32) -> {{ACC}} {
    let v = x[i];
    return {{LOAD}};
}

fn combine(a: {{ACC}}, b: {{ACC}}) -> {{ACC}} {
    return {{COMBINE}};
}

// ARG mode: whether element b (later) replaces the running extreme a
fn takes(a: {{ACC}}, b: {{ACC}}) -> bool {
    return {{TAKES}};
}

// log(exp(a) + exp(b)) without overflow; -inf with -inf stays -inf, NaN spreads
fn log_add_exp(a: f32, b: f32) -> f32 {
    if (tb_isnan(a) || tb_isnan(b)) {
        return tb_nan();
    }
    let hi = max(a, b);
    let lo = min(a, b);
    if (lo == -bitcast<f32>(0x7f800000u) || hi == bitcast<f32>(0x7f800000u)) {
        return hi;
    }
    return hi + log(1.0 + exp(lo - hi));
}

// One (running, position) step: the fold so far with element k of value v.
struct Step {
    value: {{ACC}},
    at: u32,
}

fn step(s: Step, v: {{ACC}}, k: u32) -> Step {
    if (ARG) {
        if (s.at == NONE || takes(s.value, v)) {
            return Step(v, k);
        }
        return s;
    }
    return Step(combine(s.value, v), k);
}

// The fold of a segment `before` followed by a segment `after` (NONE marks an empty one).
fn join(before: Step, after: Step) -> Step {
    if (after.at == NONE) {
        return before;
    }
    if (before.at == NONE) {
        return after;
    }
    if (ARG) {
        if (takes(before.value, after.value)) {
            return after;
        }
        return before;
    }
    return Step(combine(before.value, after.value), after.at);
}

// Scan elements [start, end) of the line at `base`, continuing from `prefix`, writing each result.
fn scan_range(base: u32, inner: u32, start: u32, end: u32, prefix: Step) {
    var s = prefix;
    for (var k = start; k < end; k++) {
        let i = base + k * inner;
        s = step(s, load(i), k);
        out[i] = s.value;
        if (ARG) {
            positions[i] = i32(s.at);
        }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let group = wg.x + wg.y * groups.x;
    let n = params[1];
    let inner = params[2];
    let empty = Step({{INIT}}, NONE);
    if (LINE_PER_THREAD) {
        let line = group * WG + lid;
        if (line < params[0]) {
            scan_range((line / inner) * n * inner + line % inner, inner, 0u, n, empty);
        }
        return;
    }
    let line = group;
    if (line >= params[0]) {
        return;
    }
    let base = (line / inner) * n * inner + line % inner;
    let chunk = (n + WG - 1u) / WG;
    let start = min(lid * chunk, n);
    let end = min(start + chunk, n);

    var mine = empty;
    for (var k = start; k < end; k++) {
        mine = step(mine, load(base + k * inner), k);
    }
    carry[lid] = mine.value;
    carry_at[lid] = mine.at;
    workgroupBarrier();
    // inclusive scan of the chunk folds: afterwards carry[t] folds chunks 0..=t
    for (var d = 1u; d < WG; d <<= 1u) {
        var folded = Step(carry[lid], carry_at[lid]);
        if (lid >= d) {
            folded = join(Step(carry[lid - d], carry_at[lid - d]), folded);
        }
        workgroupBarrier();
        carry[lid] = folded.value;
        carry_at[lid] = folded.at;
        workgroupBarrier();
    }
    var prefix = empty;
    if (lid > 0u) {
        prefix = Step(carry[lid - 1u], carry_at[lid - 1u]);
    }
    scan_range(base, inner, start, end, prefix);
}
