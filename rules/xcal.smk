"""xcal study (paper 001): XCal-FL explainability-calibrated DP noise."""
