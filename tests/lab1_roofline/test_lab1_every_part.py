"""lab1_roofline: every graded part, on the reference solution and on the student version."""
from conftest import every_part_tests

test_solution_passes, test_student_version_scores_zero = every_part_tests("lab1_roofline")
