// `row_tree.wgsl`'s API on subgroup operations: each subgroup folds its values in registers, its
// first lane leaves the result in workgroup memory, and after one barrier every thread folds those
// few partials (8 on a 32-wide GPU) in the same order, so all threads get the same bits. One barrier
// per fold instead of eight: a softmax row held in registers does two folds and little else.
//
// Subgroup `s` is taken to be invocations `s·size .. (s+1)·size - 1` of the workgroup: the device
// checks that layout with a probe kernel when it opens (`device.py`) and uses `row_tree.wgsl` where
// it does not hold. The kernel's entry point sets `sg_lane` and `sg_size` from its builtins.

var<workgroup> partial: array<f32, 256>;
var<private> sg_lane: u32;
var<private> sg_size: u32;

// the subgroups' results (one per subgroup, in `folded` of every lane) folded across the workgroup
fn fold_partials(lid: u32, folded: f32, is_max: bool) -> f32 {
    if (sg_lane == 0u) {
        partial[lid / sg_size] = folded;
    }
    workgroupBarrier();
    var total = partial[0];
    for (var s = 1u; s < 256u / sg_size; s++) {
        total = select(total + partial[s], max(total, partial[s]), is_max);
    }
    workgroupBarrier();
    return total;
}

fn fold_sum(lid: u32, value: f32) -> f32 {
    return fold_partials(lid, subgroupAdd(value), false);
}

fn fold_max(lid: u32, value: f32) -> f32 {
    return fold_partials(lid, subgroupMax(value), true);
}
