#![allow(clippy::too_many_arguments)]
macro_rules! s {
    ($ln:ident, $rms:ident, $gn:ident, $t:ty) => {
        pub fn $ln(
            _r: usize,
            _n: usize,
            _x: &[$t],
            _w: Option<&[$t]>,
            _b: Option<&[$t]>,
            _e: f64,
            _o: &mut [$t],
            _m: Option<&mut [$t]>,
            _s: Option<&mut [$t]>,
        ) {
            unimplemented!()
        }
        pub fn $rms(_r: usize, _n: usize, _x: &[$t], _w: Option<&[$t]>, _e: f64, _o: &mut [$t]) {
            unimplemented!()
        }
        pub fn $gn(
            _n: usize,
            _c: usize,
            _hw: usize,
            _g: usize,
            _x: &[$t],
            _w: Option<&[$t]>,
            _b: Option<&[$t]>,
            _e: f64,
            _o: &mut [$t],
            _m: Option<&mut [$t]>,
            _s: Option<&mut [$t]>,
        ) {
            unimplemented!()
        }
    };
}
s!(layer_norm_f32, rms_norm_f32, group_norm_f32, f32);
s!(layer_norm_f64, rms_norm_f64, group_norm_f64, f64);
