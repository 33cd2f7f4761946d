//! `PythonRandom` against CPython 3.11's `random.Random`: the values below are
//! `r = random.Random(seed); [r.randrange(262144) for _ in range(4)], [r.randrange(986) for _ in range(4)], r.getrandbits(32)`.

use dg_sampler::PythonRandom;

#[test]
fn draws_equal_cpython() {
    let cases: [(i64, [u32; 4], [u32; 4], u32); 6] = [
        (0, [201979, 220500, 21225, 135746], [523, 497, 414, 940], 3366389305),
        (1, [70445, 33086, 133729, 61823], [507, 779, 460, 483], 2798570523),
        (12345, [218428, 5331, 156573, 193153], [954, 198, 276, 579], 1873586768),
        (4294967295, [106535, 112901, 152743, 178272], [984, 390, 688, 705], 3753228856),
        (4294967301, [82456, 254539, 148104, 7614], [363, 642, 175, 796], 4091098108),
        (1099511627853, [200332, 194744, 170395, 187291], [886, 501, 763, 524], 4097379681),
    ];
    for (seed, big, small, bits) in cases {
        let mut r = PythonRandom::new(seed);
        let got_big: Vec<u32> = (0..4).map(|_| r.randrange(262144)).collect();
        let got_small: Vec<u32> = (0..4).map(|_| r.randrange(986)).collect();
        assert_eq!((got_big.as_slice(), got_small.as_slice(), r.getrandbits(32)), (&big[..], &small[..], bits), "seed {seed}");
    }
    // CPython seeds with abs(seed).
    assert_eq!(PythonRandom::new(-12345).next_u32(), PythonRandom::new(12345).next_u32());
}
