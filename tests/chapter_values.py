"""The chapter's printed tables ("The cat sat on mat", slopes 1/2 and 1/4), copied as printed.

The chapter rounds to 4 decimals, so anything computed is compared with atol = 5e-5.
"""

import numpy as np

PRINTED_ATOL = 5e-5

HEAD1_WEIGHTS = np.array([
    [0.2879, 0.3541, 0.2148, 0.0642, 0.0790],
    [0.3791, 0.1520, 0.3791, 0.0559, 0.0339],
    [0.1003, 0.1653, 0.5527, 0.0815, 0.1003],
    [0.0796, 0.1312, 0.2163, 0.3566, 0.2163],
    [0.0341, 0.1140, 0.1880, 0.1528, 0.5110],
])
HEAD2_WEIGHTS = np.array([
    [0.2142, 0.3384, 0.1299, 0.2052, 0.1122],
    [0.3002, 0.1901, 0.1480, 0.2338, 0.1279],
    [0.1077, 0.2806, 0.1776, 0.2806, 0.1534],
    [0.1106, 0.1421, 0.0899, 0.4750, 0.1824],
    [0.1545, 0.0978, 0.1256, 0.3271, 0.2949],
])
AVERAGED_WEIGHTS = np.array([
    [0.2510, 0.3462, 0.1724, 0.1347, 0.0956],
    [0.3397, 0.1710, 0.2636, 0.1449, 0.0809],
    [0.1040, 0.2229, 0.3652, 0.1810, 0.1268],
    [0.0951, 0.1366, 0.1531, 0.4158, 0.1994],
    [0.0943, 0.1059, 0.1568, 0.2400, 0.4030],
])
OUTPUT = np.array([
    [0.3274, 0.3936, 0.1861, 0.2613],
    [0.3961, 0.1689, 0.2120, 0.2977],
    [0.1504, 0.2154, 0.2544, 0.3573],
    [0.1877, 0.2393, 0.1811, 0.5662],
    [0.2896, 0.3695, 0.2731, 0.4746],
])
# Standard attention (no ALiBi), head 1, row "The": the chapter's comparison
STANDARD_HEAD1_THE = np.array([0.1237, 0.2509, 0.2509, 0.1237, 0.2509])
# Head 2, row "The": scaled scores and ALiBi scores as printed in the step-by-step
HEAD2_THE_SCALED = np.array([0.000, 0.707, 0.000, 0.707, 0.354])
HEAD2_THE_ALIBI = np.array([0.000, 0.457, -0.500, -0.043, -0.646])
PRINTED_3DP_ATOL = 5e-4
# "on" in head 1 has all-zero content scores; ALiBi alone makes these scores
HEAD1_ON_ALIBI = np.array([-1.5, -1.0, -0.5, 0.0, -0.5])
